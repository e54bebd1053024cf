"""The one script to run on a GPU machine: the paper's base and big models trained and
decoded on one GPU, against the GPU's peak and the plan's memory (installs nothing).

For ``configs/base.py`` and ``configs/big.py`` in the fast GPU variant (bfloat16 compute,
cuDNN attention): the training step that ``train.py`` runs (``DataParallel`` on one
device) on a batch of ``data.tokens_per_batch`` source and target tokens at the largest
bucket (``data.max_len``) of random tokens, timed over ``--steps`` steps after two warm-up
steps (median); tokens/s (source + target); MFU = analytic FLOPs per step
(``analysis.costs.training_flops``) / step time / the GPU's peak bfloat16 FLOP/s
(``aot.gpus``); the device's peak memory in use against XLA's memory analysis of the
same program (what ``python -m transformer_jax.plan`` reports without a GPU); and cached
beam-4 search (``config.decode``) of ``--decode-batch`` random sources of 64 tokens.

    python benchmarks/gpu_check.py [--gpu h100] [--json results/gpu_check.json]
    python benchmarks/gpu_check.py --smoke   # the tiny config on any backend (CI, on CPU)
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
import jax
import numpy as np
from _common import ROOT, describe_machine, machine, table, time_calls, write_json

from transformer_jax.analysis.costs import training_flops
from transformer_jax.aot.gpus import GPUS
from transformer_jax.aot.plan import products_precision
from transformer_jax.data.plans import batch_rows
from transformer_jax.ids import EOS_ID
from transformer_jax.inference.decoding import beam_search
from transformer_jax.model.transformer import Transformer
from transformer_jax.training.parallel import DataParallel
from transformer_jax.training.run import init_state
from transformer_jax.training.validation import validate_config

GPU_VARIANT = {"dtype": "bfloat16", "attention_impl": "cudnn", "platform": "gpu"}


def load_config(name: str, smoke: bool) -> Any:
    spec = importlib.util.spec_from_file_location(name, f"{ROOT}/configs/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    if not smoke:
        config.model.update(GPU_VARIANT)
    return config


def train_row(name: str, config: Any, peak: float, steps: int) -> dict[str, Any]:
    """Time the run's train step on one device; its memory, measured and analysed."""
    model = validate_config(config)
    length = config.data.max_len
    rows = batch_rows(config.data.tokens_per_batch, length, 1)
    rng = np.random.default_rng(0)
    ids = lambda: rng.integers(4, model.tgt_vocab, (rows, length), dtype=np.int32)  # noqa: E731
    batch = {"src": ids(), "tgt_in": ids(), "tgt_out": ids()}
    device = jax.local_devices()[0]
    dp = DataParallel(config.train.parallel, Transformer(model), 0.1, devices=[device])
    state = dp.replicate(init_state(model, config))
    analysed = dp._train.lower(state, dp.put_batch(batch)).compile().memory_analysis()
    holder = {"state": state}

    def step() -> None:
        holder["state"], metrics = dp.train_step(holder["state"], batch)
        jax.block_until_ready(metrics)

    time_calls(step, 2)  # compiles, warms up
    seconds = statistics.median(time_calls(step, steps))
    flops = training_flops(model, length, length, rows)
    stats = device.memory_stats() or {}
    total = (
        analysed.argument_size_in_bytes
        + analysed.output_size_in_bytes
        - analysed.alias_size_in_bytes
        + analysed.temp_size_in_bytes
    )
    return {
        "config": name,
        "batch": f"{rows} x {length}",
        "step_ms": 1e3 * seconds,
        "tokens_per_s": 2 * rows * length / seconds,
        "mfu": flops / seconds / peak if peak else float("nan"),
        "peak_memory_gib": stats.get("peak_bytes_in_use", float("nan")) / 2**30,
        "plan_memory_gib": total / 2**30,
    }


def decode_row(name: str, config: Any, batch: int, repeats: int) -> dict[str, Any]:
    """Cached beam search (config.decode) of ``batch`` random 64-token sources."""
    model = validate_config(config)
    src_len = min(64, model.max_len)
    params = init_state(model, config).params
    src = np.random.default_rng(1).integers(4, model.src_vocab, (batch, src_len), np.int32)
    src[:, -1] = EOS_ID
    decode = config.decode
    search = jax.jit(
        lambda p, s: beam_search(
            model,
            p,
            s,
            beam_size=decode.beam_size,
            alpha=decode.alpha,
            max_extra_len=decode.max_extra_len,
        )
    )
    params = jax.device_put(params)
    out = np.asarray(search(params, src))  # compiles
    seconds = statistics.median(
        time_calls(lambda: search(params, src).block_until_ready(), repeats)
    )
    return {
        "config": name,
        "batch": f"{batch} x {src_len}",
        "decode_ms": 1e3 * seconds,
        "sentences_per_s": batch / seconds,
        "output_tokens_per_s": int(np.count_nonzero(out)) / seconds,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", choices=sorted(GPUS), help="peak FLOP/s (default: from device)")
    parser.add_argument("--steps", type=int, default=10, help="timed train steps")
    parser.add_argument("--decode-batch", type=int, default=64)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--smoke", action="store_true", help="configs/tiny.py, one step")
    args = parser.parse_args(argv)
    info = machine()
    kind = jax.local_devices()[0].device_kind
    gpu = GPUS.get(args.gpu) or next((g for g in GPUS.values() if g.name == kind), None)
    names = ["tiny"] if args.smoke else ["base", "big"]
    steps, repeats = (1, 1) if args.smoke else (args.steps, 3)
    train, decode = [], []
    for name in names:
        config = load_config(name, args.smoke)
        model = validate_config(config)
        peak = gpu.peak_flops(products_precision(model)) if gpu else 0.0
        train.append(train_row(name, config, peak, steps))
        decode.append(decode_row(name, config, 2 if args.smoke else args.decode_batch, repeats))
    print(f"{kind}; {describe_machine(info)}")
    print(table(list(train[0]), [list(r.values()) for r in train]))
    print(table(list(decode[0]), [list(r.values()) for r in decode]))
    payload = {"machine": info, "device": kind, "train": train, "decode": decode}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
