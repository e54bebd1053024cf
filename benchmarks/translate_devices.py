"""Translation over several devices: ``translate_lines`` (what ``translate`` and ``evaluate``
run) on the first local device alone and on all of them, the same lines, the same outputs.

A random ``small`` model (``train_throughput.py``'s; the EOS embedding row zeroed, so that
no sentence ends early and every one decodes ``--max-extra-len`` tokens past its source)
translates ``--sentences`` sentences of the embedded synthetic task with beam ``--beam``;
the tokenizer is trained on them. Each setting is timed after a warm-up call (compiling
each bucket's program on each device), median of ``--repeats`` interleaved calls. On a CPU
host ``--devices N`` simulates N devices (``--xla_force_host_platform_device_count``), which
share the host's cores.

    python benchmarks/translate_devices.py --devices 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
import flax.linen as nn
import jax
from _common import describe_machine, machine, table, time_calls, write_json
from _throughput_settings import SETTINGS

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.data.synthetic import synthetic_pairs
from transformer_jax.data.tokenizer import train_tokenizer
from transformer_jax.ids import EOS_ID
from transformer_jax.inference.translation import translate_lines


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=2, help="simulated CPU devices")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-extra-len", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="a tiny model, a few sentences")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.sentences, args.batch_size, args.max_extra_len, args.repeats = 4, 4, 2, 1
    return args


def simulate_devices(count: int) -> None:
    """Ask XLA:CPU for ``count`` devices (read when JAX starts its backend: no effect after)."""
    flag = f"--xla_force_host_platform_device_count={count}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    lines = [source for source, _ in synthetic_pairs("train")[: args.sentences]]
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = train_tokenizer(lines, os.path.join(folder, "tokenizer.model"), 300)
    sizes = SETTINGS["small"].model | {"vocab_size": 300}
    if args.smoke:
        sizes |= {"d_model": 16, "num_heads": 2, "d_ff": 32}
        sizes |= {"num_encoder_layers": 1, "num_decoder_layers": 1}
    config = TransformerConfig(**sizes)
    ids = jax.numpy.ones((1, 8), jax.numpy.int32)
    params = nn.unbox(jax.jit(Transformer(config).init)(jax.random.key(0), ids, ids)["params"])
    embedding = params["shared_embed"]["embedding"]
    params["shared_embed"]["embedding"] = embedding.at[EOS_ID].set(0.0)  # no early EOS
    params = jax.device_get(params)
    options = dict(beam_size=args.beam, max_extra_len=args.max_extra_len)
    options["batch_size"] = args.batch_size
    settings = {"1 device": jax.local_devices()[:1], f"{jax.local_device_count()} devices": None}
    run = {
        name: lambda d=devices: translate_lines(
            config, params, tokenizer, lines, devices=d, **options
        )
        for name, devices in settings.items()
    }
    outputs = {name: fn() for name, fn in run.items()}  # compiles
    times: dict[str, list[float]] = {name: [] for name in run}
    for _ in range(args.repeats):
        for name, fn in run.items():
            times[name] += time_calls(fn, 1)
    first = statistics.median(times["1 device"])
    rows = [
        {
            "setting": name,
            "seconds": statistics.median(t),
            "sentences_per_s": len(lines) / statistics.median(t),
            "speed_up": first / statistics.median(t),
        }
        for name, t in times.items()
    ]
    same = len({tuple(out) for out in outputs.values()}) == 1
    return {"rows": rows, "same_translations": same}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    simulate_devices(args.devices)
    info = machine()
    result = measure(args)
    print(f"machine: {describe_machine(info)}")
    print(
        f"{args.sentences} synthetic sentences, beam {args.beam}, batches of {args.batch_size}, "
        f"up to source + {args.max_extra_len} tokens (EOS suppressed), random weights; "
        f"translations the same on one and all devices: {result['same_translations']}"
    )
    print(table(list(result["rows"][0]), [list(r.values()) for r in result["rows"]]))
    payload = {"machine": info, "settings": vars(args), **result}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
