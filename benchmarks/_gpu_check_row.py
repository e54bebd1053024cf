"""One row of ``gpu_check.py`` in its own process (its peak memory is its own), or ``--probe``.

``python benchmarks/_gpu_check_row.py SPEC``: SPEC is a JSON row (``gpu_check.row_spec``);
the last stdout line is ``ROW {json}``. ``--probe``: ``PROBE {json}`` with the backend,
the devices and the installed versions, before any row starts.

A row builds the run's parallel object as ``train.py`` does (``training.mesh.run_parallel``
with the config's ``train.parallel``, loss settings and mesh, over all devices), places a
fresh train state and a batch of random tokens of ``data.tokens_per_batch`` at the longest
bucket (``data.max_len``) with ``put_batch``, and times ``train_step`` (two warm-up steps,
the first compiling, then the median of ``steps``); then the collectives of a step over all
devices (``pmap`` / ``shard_map``: an all-reduce of a float32 gradient the size of the
parameters; ``mesh``: the FSDP pair, an all-gather of the parameters from their shards
and a reduce-scatter of a gradient), and beam search (``config.decode``) of one batch of
random sources on every device at once (the parameters copied to each, as ``translate``
decodes).
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
import jax
import jax.numpy as jnp
import numpy as np
from _common import time_calls
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer_jax.analysis.costs import training_flops
from transformer_jax.aot.gpus import device_gpu, software_versions
from transformer_jax.aot.plan import products_precision
from transformer_jax.aot.programs import plugin_available
from transformer_jax.compilation_cache import use_compilation_cache
from transformer_jax.configs import config_file
from transformer_jax.data.grouping import batch_rows
from transformer_jax.ids import EOS_ID
from transformer_jax.inference.translation import decode_batch
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.transformer import Transformer
from transformer_jax.training.mesh import run_parallel
from transformer_jax.training.run import init_state
from transformer_jax.training.schema import RunConfig
from transformer_jax.training.validation import validate_config

DECODE_SRC_LEN = 64


def load_config(name: str, overrides: dict[str, Any]) -> RunConfig:
    """The packaged config ``name`` with ``{'section.field': value}`` overrides applied."""
    spec = importlib.util.spec_from_file_location(name, config_file(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    for key, value in overrides.items():
        section, field = key.split(".")
        setattr(config[section], field, value)
    return RunConfig.from_config(config)


def probe() -> dict[str, Any]:
    devices = jax.local_devices()
    return {
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "devices": len(devices),
        "cuda_plugin": plugin_available(),
        "versions": software_versions(),
    }


def train(
    config: RunConfig, model: TransformerConfig, steps: int
) -> tuple[dict[str, Any], Any, Any]:
    """Time the run's train step; the row's figures, the parallel object and the state."""
    dp = run_parallel(config.train, Transformer(model))
    length = config.data.max_len
    rows = batch_rows(config.data.tokens_per_batch, length, jax.device_count())
    rng = np.random.default_rng(0)
    ids = lambda vocab: rng.integers(4, vocab, (rows, length), dtype=np.int32)  # noqa: E731
    batch = dp.put_batch(
        {
            "src": ids(model.src_vocab),
            "tgt_in": ids(model.tgt_vocab),
            "tgt_out": ids(model.tgt_vocab),
        }
    )
    holder = {"state": dp.replicate(init_state(model, config))}

    def step() -> None:
        holder["state"], metrics = dp.train_step(holder["state"], batch)
        jax.block_until_ready(metrics)

    time_calls(step, 2)  # the first compiles
    seconds = statistics.median(time_calls(step, steps))
    devices = jax.local_devices()
    gpu = device_gpu(devices[0].device_kind)
    peak = gpu.peak_flops(products_precision(model)) * len(devices) if gpu else float("nan")
    flops = training_flops(model, length, length, rows)
    stats = [d.memory_stats() or {} for d in devices]
    row = {
        "parallel": config.train.parallel,
        "devices": len(devices),
        "dtype": jnp.dtype(model.dtype).name,
        "attention": model.attention_impl,
        "batch": f"{rows} x {length}",
        "step_ms": 1e3 * seconds,
        "tokens_per_s": 2 * rows * length / seconds,
        "mfu": flops / seconds / peak,
        "peak_memory_gib": max(s.get("peak_bytes_in_use", float("nan")) for s in stats) / 2**30,
    }
    return row, dp, holder["state"]


def _shard_map(fn: Any, mesh: Mesh, in_spec: P, out_spec: P) -> Any:
    mapped = jax.shard_map(fn, mesh=mesh, in_specs=in_spec, out_specs=out_spec, check_vma=False)
    return jax.jit(mapped)


def collectives(kind: str, params: int, repeats: int) -> dict[str, dict[str, float]]:
    """Milliseconds and bus GB/s of the step's collectives over all devices (none on one):
    an all-reduce of ``params`` float32 gradients, or (``mesh``) the all-gather of the
    parameters from their shards and the reduce-scatter of a gradient."""
    devices = jax.devices()
    n = len(devices)
    if n == 1:
        return {}
    mesh = Mesh(np.array(devices), ("d",))
    split = NamedSharding(mesh, P("d"))
    size = -(-params // n) * n
    grads = jax.jit(lambda: jnp.zeros((n, size), jnp.float32), out_shardings=split)()
    if kind == "mesh":
        shards = jax.jit(lambda: jnp.zeros((size,), jnp.float32), out_shardings=split)()
        gather = lambda s: jax.lax.all_gather(s, "d", tiled=True)  # noqa: E731
        scatter = lambda g: jax.lax.psum_scatter(g[0], "d", tiled=True)  # noqa: E731
        ops = {
            "all-gather": (_shard_map(gather, mesh, P("d"), P()), shards, (n - 1) / n),
            "reduce-scatter": (_shard_map(scatter, mesh, P("d"), P("d")), grads, (n - 1) / n),
        }
    else:
        reduce = lambda g: jax.lax.psum(g, "d")  # noqa: E731
        ops = {"all-reduce": (_shard_map(reduce, mesh, P("d"), P("d")), grads, 2 * (n - 1) / n)}
    out = {}
    for name, (fn, x, factor) in ops.items():
        jax.block_until_ready(fn(x))  # compiles
        seconds = statistics.median(time_calls(lambda f=fn, x=x: f(x).block_until_ready(), repeats))
        out[name] = {"ms": 1e3 * seconds, "bus_gb_per_s": factor * 4 * size / seconds / 1e9}
    return out


def decode(
    config: RunConfig, model: TransformerConfig, copies: list[Any], batch: int, repeats: int
) -> dict:
    """Beam search of ``batch`` random sources on each device at once (one call each)."""
    src_len = min(DECODE_SRC_LEN, model.max_len)
    src = np.random.default_rng(1).integers(4, model.src_vocab, (batch, src_len), np.int32)
    src[:, -1] = EOS_ID
    settings = config.decode

    def run() -> None:
        outs = [
            decode_batch(model, p, src, settings.beam_size, settings.alpha, settings.max_extra_len)
            for p in copies
        ]
        jax.block_until_ready(outs)

    run()  # compiles, once per device
    seconds = statistics.median(time_calls(run, repeats))
    sentences = batch * len(copies)
    return {
        "beam": settings.beam_size,
        "decode_batch": f"{len(copies)} x {batch} x {src_len}",
        "decode_ms": 1e3 * seconds,
        "sentences_per_s": sentences / seconds,
    }


def run_row(spec: dict[str, Any]) -> dict[str, Any]:
    use_compilation_cache(enabled=spec["compilation_cache"])
    config = load_config(spec["config"], spec["overrides"])
    model = validate_config(config)
    row, dp, state = train(config, model, spec["steps"])
    params = sum(int(np.prod(np.shape(x))) for x in jax.tree.leaves(state.params))
    row["collectives"] = collectives(config.train.parallel, params, spec["repeats"])
    copies = dp.local_copies(state.params)
    del state
    return row | decode(config, model, copies, spec["decode_batch"], spec["repeats"])


if __name__ == "__main__":
    if sys.argv[1] == "--probe":
        print("PROBE " + json.dumps(probe()))
    else:
        print("ROW " + json.dumps(run_row(json.loads(sys.argv[1]))))
