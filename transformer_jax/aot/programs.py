"""The run's programs compiled for GPUs that are not there (deviceless ahead-of-time).

``jax.experimental.topologies`` with a GPU's target config (:mod:`.gpus`) gives
compile-only devices; the training step of ``train.parallel``'s strategy
(``training.mesh.run_parallel``'s :class:`~transformer_jax.training.parallel.Parallel`:
its ``step_program``, the program ``train.py`` runs over the devices for the run's batch
shapes) and
the beam search of ``translate`` / ``evaluate`` compile for them from abstract arguments.
Nothing is executed and no parameter is made. This needs the CUDA plugin of the installed
jax (``pip install -e '.[gpu-aot]'``); run it with ``JAX_PLATFORMS=cpu``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies
from jax.sharding import SingleDeviceSharding

from transformer_jax.aot.gpus import Gpu, target_config
from transformer_jax.aot.xla_log import captured_stderr, read_xla_log
from transformer_jax.inference.decoding import beam_search
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.transformer import Transformer
from transformer_jax.training.mesh import run_parallel
from transformer_jax.training.parallel import Parallel, spec
from transformer_jax.training.run import new_state
from transformer_jax.training.schema import RunConfig

PLUGIN = "jax_plugins.xla_cuda12"
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
CUDNN_ATTENTION = "__cudnn$fmha"
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2}
DTYPE_BYTES |= {"f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}


def plugin_available() -> bool:
    """Whether JAX's CUDA plugin (which compiles for a GPU) is installed."""
    try:
        return importlib.util.find_spec(PLUGIN) is not None
    except ModuleNotFoundError:  # no jax_plugins package at all
        return False


def parse_topology(topology: str) -> tuple[int, int, int]:
    """``'HOSTSxPROCESSESxDEVICES'`` (e.g. ``'1x1x8'``, ``'2x1x8'``) as three positive ints."""
    parts = topology.split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(
            f"--topology must be three positive integers joined by 'x' (hosts x processes "
            f"per host x GPUs per process, e.g. 1x1x8), got {topology!r}"
        )
    return int(parts[0]), int(parts[1]), int(parts[2])


def gpu_devices(gpu: Gpu, topology: str) -> list[Any]:
    """Compile-only devices of ``topology`` made of ``gpu``; ValueError without the plugin."""
    parse_topology(topology)
    if not plugin_available():
        raise ValueError(
            "compiling for a GPU without one needs JAX's CUDA plugin of the installed jax: "
            "pip install -e '.[gpu-aot]' (README, GPUs)"
        )
    try:
        desc = topologies.get_topology_desc(
            platform="cuda", target_config=target_config(gpu), topology=topology
        )
    except (RuntimeError, NotImplementedError) as e:  # the plugin's refusal, one line
        raise ValueError(f"--topology {topology!r}: {str(e).splitlines()[0]}") from None
    return list(desc.devices)


@dataclasses.dataclass
class Compiled:
    """One compiled program: XLA's per-device memory analysis and what its HLO holds."""

    seconds: float  # lowering + compiling
    argument_bytes: int
    output_bytes: int
    alias_bytes: int  # outputs written over donated arguments
    temp_bytes: int
    hlo: dict[str, Any]  # hlo_summary of the optimized module
    xla_notes: dict[str, Any] = dataclasses.field(  # xla_log.read_xla_log's notes
        default_factory=lambda: {"could_not_fit": None, "slow_compile_alarms": 0}
    )

    @property
    def total_bytes(self) -> int:
        """Device memory the program holds at once: arguments, new outputs, temporaries."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes


def compile_program(fn: Any, *args: Any) -> Compiled:
    """Lower and compile the jitted/pmapped ``fn`` for ``args`` (abstract, with shardings);
    XLA's log of the compile is read into ``xla_notes``, its other lines passed on."""
    start = time.perf_counter()
    with captured_stderr() as log:
        compiled = fn.lower(*args).compile()
    seconds = time.perf_counter() - start
    notes, others = read_xla_log(log[0])
    for line in others:
        print(line, file=sys.stderr)
    memory = compiled.memory_analysis()
    return Compiled(
        seconds=seconds,
        argument_bytes=memory.argument_size_in_bytes,
        output_bytes=memory.output_size_in_bytes,
        alias_bytes=memory.alias_size_in_bytes,
        temp_bytes=memory.temp_size_in_bytes,
        hlo=hlo_summary(compiled.as_text()),
        xla_notes=notes,
    )


def _shape_bytes(text: str) -> int:
    """Bytes of the array shapes in an HLO result type, e.g. ``(f32[8,512]{1,0}, bf16[4])``."""
    total = 0
    for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", text):
        if dtype in DTYPE_BYTES:
            total += DTYPE_BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d]))
    return total


def hlo_summary(text: str) -> dict[str, Any]:
    """What an optimized HLO module holds: its collectives (count and result bytes per
    kind; an async pair counts once), cuDNN attention calls, host transfers, optimization
    barriers, and matrix products (``dot``) below HIGHEST precision."""
    collectives = {kind: {"count": 0, "bytes": 0} for kind in COLLECTIVES}
    for line in text.splitlines():
        match = re.match(r"\s*(?:ROOT )?%\S+ = (.+?) ([a-z-]+)\(", line)
        if not match:
            continue
        result, op = match.groups()
        kind = op.removesuffix("-start")
        if kind in collectives and not op.endswith("-done"):
            collectives[kind]["count"] += 1
            collectives[kind]["bytes"] += _shape_bytes(result)
    dots = re.findall(r"= \S+ dot\(.*", text)
    return {
        "collectives": {k: v for k, v in collectives.items() if v["count"]},
        "cudnn_attention_calls": len(re.findall(r'custom_call_target="__cudnn\$fmha', text)),
        "host_transfers": len(re.findall(r"is_host_transfer=true", text)),
        "optimization_barriers": len(re.findall(r"\bopt-barrier\(", text)),
        "dots": len(dots),
        "dots_below_highest": sum("operand_precision={highest,highest}" not in d for d in dots),
    }


def gpu_model_config(model: TransformerConfig) -> TransformerConfig:
    """``model`` with its platform set to the GPU (the kernel set follows it)."""
    return model.replace(platform="gpu")


def abstract_state(model: TransformerConfig, config: RunConfig) -> Any:
    """The train state's shapes and dtypes (nothing is made)."""
    return jax.eval_shape(lambda: new_state(model, config))


def parallel_on(model: TransformerConfig, config: RunConfig, devices: list[Any]) -> Parallel:
    """``train.parallel``'s strategy on ``devices``, as ``train.py`` makes it."""
    return run_parallel(config.train, Transformer(model), devices)


def train_program(
    model: TransformerConfig,
    config: RunConfig,
    devices: list[Any],
    rows: int,
    length: int,
) -> Compiled:
    """The step ``train.py`` runs on ``devices`` for a global batch of ``rows`` x ``length``
    (``rows`` a multiple of the device count): ``train_step``, or with
    ``train.grad_accum_steps > 1`` one micro-batch's ``accumulate``."""
    dp = parallel_on(model, config, devices)
    state = abstract_state(model, config)
    program = dp.step_program(state, rows, length, config.train.grad_accum_steps)
    return compile_program(program.fn, *program.args)


def device_state(model: TransformerConfig, config: RunConfig, devices: list[Any]) -> Any:
    """:func:`abstract_state` placed as ``train.parallel``'s strategy places it on
    ``devices`` (each device's share: the whole state for pmap / shard_map, which copy it)."""
    return parallel_on(model, config, devices).state_specs(abstract_state(model, config))


def decode_program(
    model: TransformerConfig,
    config: RunConfig,
    device: Any,
    batch: int,
    src_len: int,
) -> Compiled:
    """Beam search as ``translate`` / ``evaluate`` run it (config.decode's beam, alpha and
    extra length) on one device, for ``batch`` sources of ``src_len`` tokens."""
    sharding = SingleDeviceSharding(device)
    params = abstract_state(model, config).params
    params = jax.tree.map(lambda x: spec(x.shape, x.dtype, sharding), params)
    src = spec((batch, src_len), jnp.int32, sharding)
    decode = config.decode

    def search(params: Any, src: Any) -> Any:
        return beam_search(
            model,
            params,
            src,
            beam_size=decode.beam_size,
            alpha=decode.alpha,
            max_extra_len=decode.max_extra_len,
        )

    return compile_program(jax.jit(search), params, src)
