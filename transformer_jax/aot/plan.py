"""What a run needs on named GPUs, from its programs compiled without a GPU (:mod:`.programs`).

:func:`make_plan` compiles the run's training step for the largest bucket
(``data.max_len``: the batch shape that needs the most memory) with the rows
``data.grouping.batch_rows`` gives it, and beam search at a stated batch, and returns a
JSON-able dict:

* ``gpu``, ``topology``, ``devices``, ``parallel`` (``train.parallel``: pmap, shard_map
  and mesh all compile without devices),
  ``dtype``, ``matmul_precision``, ``products`` (the precision the products run at),
  ``attention_impl``, ``grad_accum_steps``.
* ``train`` (with ``train.grad_accum_steps > 1``: one micro-batch's accumulation, whose
  update runs once per step): ``length``, ``rows_per_device``, ``tokens_per_device`` (per side),
  ``compile_s``, per device ``param_bytes``, ``optimizer_bytes`` (a mesh's shards),
  ``argument_bytes``, ``temp_bytes``, ``total_bytes`` (arguments + new outputs + temporaries),
  ``memory_bytes`` (the GPU's), ``usable_bytes`` (``memory_fraction`` of it: JAX
  preallocates 75% by default), ``could_not_fit`` (None, or XLA's rematerialization
  failing to reach XLA's memory limit: ``limit_bytes``, ``reached_bytes``,
  ``original_bytes``; :mod:`.xla_log`), ``fits`` (within ``usable_bytes`` and not
  ``could_not_fit``); ``hlo`` (:func:`.programs.hlo_summary`:
  collectives with count and bytes per step, cuDNN attention calls, host transfers,
  optimization barriers, products below HIGHEST).
* ``fit``: the largest ``data.tokens_per_batch`` whose step fits ``target_bytes``
  (``usable_bytes`` less ``margin``), from a linear fit of the step's total bytes against
  its rows over two compiles (``rows``, ``total_bytes``), then compiled at the answer
  (``checked_rows``, ``checked_total_bytes``, ``checked_could_not_fit``; a check that does
  not fit is retried smaller): ``max_rows_per_device`` (0 when no check fit),
  ``max_tokens_per_device``, ``max_tokens_per_batch`` (global, this topology).
* ``estimate`` (a roofline estimate, not a measurement): ``flops_per_device``
  (``analysis.costs.training_flops``), ``peak_flops``, ``compute_s``, ``memory_s`` (every
  argument and temporary written once and read once, over the HBM bandwidth),
  ``comm_s`` (ring all-reduce of the collectives' bytes over NVLink, or over the network
  between hosts), ``step_s`` (max(compute, memory) + comm), ``tokens_per_s`` (global,
  source + target), ``mfu`` at that time.
* ``decode``: beam search (``config.decode``) on one device: ``batch``, ``src_len``,
  ``compile_s``, ``argument_bytes``, ``temp_bytes``, ``total_bytes``, ``hlo``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.analysis.costs import training_flops
from transformer_jax.aot.gpus import (
    CUDNN_VERSION,
    DEFAULT_MEMORY_FRACTION,
    NETWORK_BANDWIDTH,
    Gpu,
    get_gpu,
    software_versions,
)
from transformer_jax.aot.programs import (
    Compiled,
    decode_program,
    device_state,
    gpu_devices,
    parse_topology,
    train_program,
)
from transformer_jax.data.grouping import batch_rows
from transformer_jax.model.config import TransformerConfig
from transformer_jax.training.schema import RunConfig
from transformer_jax.training.validation import validate_config

FIT_FACTOR = 4  # the fit's second compile has this many times the run's rows
FIT_MARGIN = 0.05  # the largest fit leaves this share of the usable memory free
FIT_RETRIES = 2  # smaller batches compiled when the checked answer does not fit


def _nbytes(tree: Any) -> int:
    """Bytes per device: a sharded leaf's shard, others whole."""
    shape = lambda x: x.shape if x.sharding is None else x.sharding.shard_shape(x.shape)  # noqa: E731
    return int(sum(np.prod(shape(x)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def products_precision(model: TransformerConfig) -> str:
    """The precision the matrix products run at: 'bfloat16', 'tf32' or 'float32'."""
    return "bfloat16" if jnp.dtype(model.dtype) == jnp.bfloat16 else model.matmul_precision


def estimate(
    gpu: Gpu, model: TransformerConfig, compiled: Compiled, rows: int, length: int, hosts: int
) -> dict[str, float]:
    """The roofline estimate of one step of ``rows`` x ``length`` per device."""
    flops = training_flops(model, length, length, rows)
    peak = gpu.peak_flops(products_precision(model))
    compute = flops / peak
    memory = 2 * (compiled.argument_bytes + compiled.temp_bytes) / gpu.memory_bandwidth
    link = NETWORK_BANDWIDTH if hosts > 1 else gpu.nvlink_bandwidth
    reduced = sum(c["bytes"] for c in compiled.hlo["collectives"].values())
    comm = 2 * reduced / link  # a ring all-reduce sends and receives ~2x its bytes
    step = max(compute, memory) + comm
    return {
        "flops_per_device": flops,
        "peak_flops": peak,
        "compute_s": compute,
        "memory_s": memory,
        "comm_s": comm,
        "step_s": step,
        "tokens_per_device_per_s": 2 * rows * length / step,
        "mfu": compute / step,
    }


def _train_entry(compiled: Compiled, rows: int, length: int, state: Any, gpu: Gpu) -> dict:
    return {
        "length": length,
        "rows_per_device": rows,
        "tokens_per_device": rows * length,
        "compile_s": round(compiled.seconds, 1),
        "param_bytes": _nbytes(state.params),
        "optimizer_bytes": _nbytes(state.opt_state),
        "argument_bytes": compiled.argument_bytes,
        "temp_bytes": compiled.temp_bytes,
        "total_bytes": compiled.total_bytes,
        "memory_bytes": gpu.memory_bytes,
        "hlo": compiled.hlo,
        "could_not_fit": compiled.xla_notes["could_not_fit"],
    }


def fits(compiled: Compiled, limit: int) -> bool:
    """Whether ``compiled`` holds at most ``limit`` bytes and XLA's rematerialization brought
    it under XLA's own memory limit."""
    return compiled.total_bytes <= limit and compiled.xla_notes["could_not_fit"] is None


def _fit(
    compile_rows: Callable[[int], Compiled], first: Compiled, rows: int, usable: int
) -> dict[str, Any]:
    """The most rows per device whose step fits ``usable`` bytes less :data:`FIT_MARGIN`: a
    line through two compiles, checked by compiling the answer (and a smaller one, up to
    :data:`FIT_RETRIES` times, while the check does not fit)."""
    target = int(usable * (1 - FIT_MARGIN))
    second_rows = FIT_FACTOR * rows
    second = compile_rows(second_rows)
    per_row = (second.total_bytes - first.total_bytes) / (second_rows - rows)
    best = rows + int((target - first.total_bytes) // per_row) if per_row > 0 else rows
    best, seconds, checked = max(best, 0), second.seconds, None
    for retry in range(FIT_RETRIES + 1):
        if best <= 0:
            break
        checked = compile_rows(best)
        seconds += checked.seconds
        if fits(checked, target) or retry == FIT_RETRIES:
            break
        best = int(best * (1 - FIT_MARGIN))
    return {
        "method": "linear fit of total bytes against rows (2 compiles), checked by compiling it",
        "margin": FIT_MARGIN,
        "target_bytes": target,
        "rows": [rows, second_rows],
        "total_bytes": [first.total_bytes, second.total_bytes],
        "max_rows_per_device": best if checked and fits(checked, target) else 0,
        "checked_rows": best if checked else None,
        "checked_total_bytes": checked.total_bytes if checked else None,
        "checked_could_not_fit": checked.xla_notes["could_not_fit"] if checked else None,
        "compile_s": round(seconds, 1),
    }


def make_plan(
    config: RunConfig,
    gpu_name: str,
    topology: str,
    *,
    decode_batch: int = 64,
    decode_src_len: int = 128,
    memory_fraction: float = DEFAULT_MEMORY_FRACTION,
    fit: bool = True,
    log: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """The plan of ``config`` on ``topology`` (``'HOSTSxPROCESSESxGPUS'``) of ``gpu_name``
    GPUs (module docstring); ``log`` is told what is compiling."""
    gpu = get_gpu(gpu_name)
    hosts = parse_topology(topology)[0]
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"--memory_fraction must be in (0, 1], got {memory_fraction!r}")
    config = config.replace(model=config.model.replace(platform="gpu"))
    model = validate_config(config)
    devices = gpu_devices(gpu, topology)
    n = len(devices)
    length = config.data.max_len
    rows = batch_rows(config.data.tokens_per_batch, length, n) // n
    usable = int(memory_fraction * gpu.memory_bytes)
    kind = config.train.parallel

    def compile_rows(r: int) -> Compiled:
        log(f"compiling the {kind} train step: {r} x {length} tokens per device on {n} {gpu.name}")
        return train_program(model, config, devices, r * n, length)

    first = compile_rows(rows)
    state = device_state(model, config, devices)
    train = _train_entry(first, rows, length, state, gpu)
    train |= {"usable_bytes": usable, "fits": fits(first, usable)}
    plan = {
        "gpu": gpu.name,
        "topology": topology,
        "devices": n,
        "parallel": kind,
        "dtype": jnp.dtype(model.dtype).name,
        "matmul_precision": model.matmul_precision,
        "products": products_precision(model),
        "attention_impl": model.attention_impl,
        "grad_accum_steps": config.train.grad_accum_steps,
        "versions": software_versions() | {"cuDNN assumed": ".".join(map(str, CUDNN_VERSION))},
        "train": train,
        "estimate": estimate(gpu, model, first, rows, length, hosts),
    }
    if fit:
        plan["fit"] = _fit(compile_rows, first, rows, usable)
        best = plan["fit"]["max_rows_per_device"]
        plan["fit"]["max_tokens_per_device"] = best * length
        plan["fit"]["max_tokens_per_batch"] = best * length * n
    if decode_batch:
        decode_src_len = min(decode_src_len, model.max_len)
        log(f"compiling beam search: {decode_batch} x {decode_src_len} source tokens")
        decoded = decode_program(model, config, devices[0], decode_batch, decode_src_len)
        plan["decode"] = {
            "batch": decode_batch,
            "src_len": decode_src_len,
            "beam_size": config.decode.beam_size,
            "compile_s": round(decoded.seconds, 1),
            "argument_bytes": decoded.argument_bytes,
            "temp_bytes": decoded.temp_bytes,
            "total_bytes": decoded.total_bytes,
            "hlo": decoded.hlo,
        }
    return plan


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"


def _could_not_fit_lines(could_not_fit: dict[str, Any] | None, indent: str) -> list[str]:
    """The plan's line for XLA's rematerialization failing to reach its memory limit."""
    if could_not_fit is None:
        return []
    return [
        f"{indent}XLA's rematerialization could not bring the step under XLA's memory limit "
        f"of {_gib(could_not_fit['limit_bytes'])} (only to "
        f"{_gib(could_not_fit['reached_bytes'])}): DOES NOT FIT"
    ]


def format_plan(plan: dict[str, Any]) -> str:
    """The plan as the lines the command prints."""
    train, est = plan["train"], plan["estimate"]
    hlo = train["hlo"]
    collectives = ", ".join(
        f"{kind} x{c['count']} ({c['bytes'] / 2**20:.1f} MiB)"
        for kind, c in hlo["collectives"].items()
    )
    program = "train step"
    if plan["grad_accum_steps"] > 1:  # the update (and its all-reduce) runs once per step
        program = "one micro-batch's gradient accumulation"
    lines = [
        f"{plan['gpu']} x {plan['devices']} (topology {plan['topology']}), {plan['parallel']}, "
        f"{plan['dtype']} (products {plan['products']}), attention "
        f"{plan['attention_impl']}, grad_accum_steps {plan['grad_accum_steps']}",
        f"{program}, per device: {train['rows_per_device']} x {train['length']} tokens "
        f"(source and target each; the largest bucket), compiled in {train['compile_s']} s",
        f"  parameters {_gib(train['param_bytes'])} + optimizer {_gib(train['optimizer_bytes'])}"
        f"; arguments {_gib(train['argument_bytes'])}, temporaries {_gib(train['temp_bytes'])}",
        f"  total {_gib(train['total_bytes'])} of {_gib(train['memory_bytes'])} "
        f"(usable {_gib(train['usable_bytes'])}): {'fits' if train['fits'] else 'DOES NOT FIT'}",
        *_could_not_fit_lines(train["could_not_fit"], "  "),
        f"  collectives per step: {collectives or 'none'}",
        f"  cuDNN attention calls: {hlo['cudnn_attention_calls']}; host transfers: "
        f"{hlo['host_transfers']}; optimization barriers: {hlo['optimization_barriers']}",
    ]
    if "versions" in plan:
        versions = ", ".join(f"{name} {v}" for name, v in plan["versions"].items())
        lines.insert(1, f"compiled with {versions}")
    if "fit" in plan:
        fit = plan["fit"]
        method = f"{fit['method']}, {fit['compile_s']} s"
        if fit["max_rows_per_device"]:
            lines.append(
                f"largest batch that fits with {fit['margin']:.0%} of usable memory to spare: "
                f"{fit['max_rows_per_device']} x {train['length']} = "
                f"{fit['max_tokens_per_device']} tokens per device, data.tokens_per_batch="
                f"{fit['max_tokens_per_batch']} (compiled at that size: "
                f"{_gib(fit['checked_total_bytes'])}; {method})"
            )
        else:
            rows = fit["checked_rows"]
            lines.append(
                "largest batch that fits: none found ("
                + (
                    f"{rows} x {train['length']} compiled to {_gib(fit['checked_total_bytes'])}"
                    if rows
                    else "the fit left no rows"
                )
                + f"; {method})"
            )
            lines += _could_not_fit_lines(fit["checked_could_not_fit"], "  ")
    lines += [
        f"estimate (roofline, not a measurement): step {est['step_s'] * 1e3:.1f} ms = "
        f"max(compute {est['compute_s'] * 1e3:.1f}, memory {est['memory_s'] * 1e3:.1f}) + "
        f"communication {est['comm_s'] * 1e3:.1f} ms; "
        f"{est['tokens_per_device_per_s'] * plan['devices']:,.0f} tokens/s "
        f"(source + target), MFU {est['mfu']:.0%} of {est['peak_flops'] / 1e12:.0f} TFLOP/s",
    ]
    if "decode" in plan:
        d = plan["decode"]
        lines.append(
            f"beam search (beam {d['beam_size']}), one device: {d['batch']} sentences x "
            f"{d['src_len']} tokens, total {_gib(d['total_bytes'])} (temporaries "
            f"{_gib(d['temp_bytes'])}), cuDNN calls {d['hlo']['cudnn_attention_calls']}, "
            f"compiled in {d['compile_s']} s"
        )
    return "\n".join(lines)
