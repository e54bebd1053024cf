"""Plan a run on GPUs from a CPU host: its programs compiled for GPUs that are not there.

    python -m transformer_jax.plan --config configs/base.py --gpu h100 --topology 1x1x8 \\
        [--config.model.dtype=bfloat16 --config.model.attention_impl=cudnn] [--json PATH]

Compiles the training step ``train.py`` would run (``train.parallel``'s pmap, shard_map or mesh
over the topology's GPUs, the config's dtype, attention and batch shapes) and beam search,
and prints per GPU: parameter, optimizer and temporary memory against the GPU's, the
largest ``data.tokens_per_batch`` that fits, the collectives and cuDNN attention calls of
the program, and a roofline estimate of the step time. ``--json`` writes the plan (keys:
:mod:`transformer_jax.aot.plan`). Needs JAX's CUDA plugin (``pip install -e
'.[gpu-aot]'``); run with ``JAX_PLATFORMS=cpu``. Topologies: ``HOSTSxPROCESSESxGPUS``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from absl import flags

from transformer_jax.aot.gpus import DEFAULT_MEMORY_FRACTION, GPUS
from transformer_jax.cli.flags import Failure, define_config_flag, no_arguments, run, run_config


def define_flags(values: flags.FlagValues, argv: list[str]) -> None:
    define_config_flag(values, argv)
    define = {"flag_values": values}
    flags.DEFINE_enum("gpu", "h100", sorted(GPUS), "The GPU to compile for.", **define)
    flags.DEFINE_string("topology", "1x1x1", "HOSTSxPROCESSESxGPUS, e.g. 1x1x8 or 2x1x8.", **define)
    flags.DEFINE_string("json", None, "Write the plan here as JSON.", **define)
    flags.DEFINE_integer(
        "decode_batch", 64, "Beam search's sentences (0: no decoding plan).", **define
    )
    flags.DEFINE_integer("decode_src_len", 128, "Beam search's source length (tokens).", **define)
    flags.DEFINE_float(
        "memory_fraction", DEFAULT_MEMORY_FRACTION, "Usable share of memory.", **define
    )
    flags.DEFINE_bool("fit", True, "Find the largest data.tokens_per_batch that fits.", **define)


def _plan(values: flags.FlagValues, positional: list[str]) -> None:
    from transformer_jax.aot.plan import format_plan, make_plan
    from transformer_jax.compilation_cache import use_compilation_cache

    no_arguments(positional)
    config = run_config(values)
    folder = os.path.dirname(os.path.abspath(values.json)) if values.json else None
    if folder and not os.path.isdir(folder):  # before minutes of compiling
        raise Failure(f"--json: folder {folder!r} does not exist")
    use_compilation_cache(enabled=False)  # jax 0.10.2 cannot load a deviceless compile's entry
    plan = make_plan(
        config,
        values.gpu,
        values.topology,
        decode_batch=values.decode_batch,
        decode_src_len=values.decode_src_len,
        memory_fraction=values.memory_fraction,
        fit=values.fit,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(format_plan(plan))
    if values.json:
        with open(values.json, "w") as f:
            json.dump(plan, f, indent=2)


def main(argv: Sequence[str] | None = None) -> int:
    """``transformer-jax plan``: plan with the command line ``argv``; the exit code."""
    return run(__doc__, define_flags, _plan, argv, "transformer-jax plan")


if __name__ == "__main__":
    sys.exit(main())
