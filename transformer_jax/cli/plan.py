"""Plan a run on GPUs from a CPU host: its programs compiled for GPUs that are not there.

    python -m transformer_jax.plan --config configs/base.py --gpu h100 --topology 1x1x8 \\
        [--config.model.dtype=bfloat16 --config.model.attention_impl=cudnn] [--json PATH]

Compiles the training step ``train.py`` would run (``train.parallel``'s pmap or shard_map
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

from absl import app, flags

from transformer_jax.aot.gpus import GPUS
from transformer_jax.aot.plan import DEFAULT_MEMORY_FRACTION, format_plan, make_plan
from transformer_jax.cli import train as train_cli

FLAGS = flags.FLAGS


def _define_flags() -> None:
    train_cli.define_config_flag()
    flags.DEFINE_enum("gpu", "h100", sorted(GPUS), "The GPU to compile for.")
    flags.DEFINE_string("topology", "1x1x1", "HOSTSxPROCESSESxGPUS, e.g. 1x1x8 or 2x1x8.")
    flags.DEFINE_string("json", None, "Write the plan here as JSON.")
    flags.DEFINE_integer("decode_batch", 64, "Beam search's sentences (0: no decoding plan).")
    flags.DEFINE_integer("decode_src_len", 128, "Beam search's source length (tokens).")
    flags.DEFINE_float("memory_fraction", DEFAULT_MEMORY_FRACTION, "Usable share of memory.")
    flags.DEFINE_bool("fit", True, "Find the largest data.tokens_per_batch that fits.")


def _plan(argv: list[str]) -> None:
    if len(argv) > 1:
        train_cli._fail(f"unexpected arguments: {argv[1:]}", train_cli.EXIT_USAGE)
    config = train_cli._load_config()
    folder = os.path.dirname(os.path.abspath(FLAGS.json)) if FLAGS.json else None
    if folder and not os.path.isdir(folder):  # before minutes of compiling
        train_cli._fail(f"--json: folder {folder!r} does not exist", train_cli.EXIT_USAGE)
    try:
        plan = make_plan(
            config,
            FLAGS.gpu,
            FLAGS.topology,
            decode_batch=FLAGS.decode_batch,
            decode_src_len=FLAGS.decode_src_len,
            memory_fraction=FLAGS.memory_fraction,
            fit=FLAGS.fit,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except ValueError as e:
        train_cli._fail(str(e), train_cli.EXIT_ERROR)
    print(format_plan(plan))
    if FLAGS.json:
        with open(FLAGS.json, "w") as f:
            json.dump(plan, f, indent=2)


def main() -> None:
    """``python -m transformer_jax.plan``: parse sys.argv, plan, print."""
    _define_flags()
    app.run(_plan, flags_parser=train_cli.flags_parser(__doc__, "gpu"))


if __name__ == "__main__":
    main()
