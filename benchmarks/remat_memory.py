"""Memory of one compiled training step with each ``model.remat`` setting: XLA's buffer
assignment for the step (temporaries, the peak of what is live besides the arguments), from
``jit(train_step).lower(...).compile().memory_analysis()``; nothing is run.

    python benchmarks/remat_memory.py
    python benchmarks/remat_memory.py --scan   # layers under nn.scan (scan_layers=True)
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

import _common
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.model.config import REMATS
from transformer_jax.training.steps import create_train_state, train_step

SETTINGS = {  # name: (model fields, batch rows, length)
    "small": (
        dict(d_model=256, num_heads=4, d_ff=1024, num_encoder_layers=6, num_decoder_layers=6),
        16,
        256,
    ),  # fmt: skip
    "smoke": (
        dict(d_model=32, num_heads=2, d_ff=64, num_encoder_layers=2, num_decoder_layers=2),
        2,
        16,
    ),  # fmt: skip
}


def step_memory(config: TransformerConfig, rows: int, length: int) -> dict[str, float]:
    """MiB of temporaries and arguments of the compiled train step of ``config``."""
    model = Transformer(config)
    batch = {k: jnp.full((rows, length), 5, jnp.int32) for k in ("src", "tgt_in", "tgt_out")}
    one = batch["src"][:1]
    params = nn.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), one, one)["params"]))
    tx = optax.adam(1e-3)
    state = jax.eval_shape(lambda p: create_train_state(p, tx, jax.random.key(1)), params)
    step = jax.jit(functools.partial(train_step, model=model), donate_argnums=0)
    memory = step.lower(state, batch).compile().memory_analysis()
    return {
        "temp_mib": memory.temp_size_in_bytes / 2**20,
        "argument_mib": memory.argument_size_in_bytes / 2**20,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scan", action="store_true", help="scan_layers=True")
    parser.add_argument("--smoke", action="store_true", help="a tiny model (tests)")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    fields, rows, length = SETTINGS["smoke" if args.smoke else "small"]
    config = TransformerConfig(vocab_size=256, max_len=length, scan_layers=args.scan, **fields)
    results = [{"remat": r, **step_memory(config.replace(remat=r), rows, length)} for r in REMATS]
    info = _common.machine()
    print(_common.describe_machine(info))
    print(f"{fields}, batch {rows} x ({length} + {length}), scan_layers={args.scan}")
    headers = ["remat", "temporaries MiB", "arguments MiB"]
    print(_common.table(headers, [[r["remat"], r["temp_mib"], r["argument_mib"]] for r in results]))
    payload = {"machine": info, "scan_layers": args.scan, "rows": results}
    _common.write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
