"""What the translate and evaluate commands share: the decoding flags, reading lines,
translating them."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from absl import flags

from transformer_jax.cli.flags import define_cache_flags
from transformer_jax.inference.config import PAPER
from transformer_jax.training.schema import RunConfig


def define_decode_flags(values: flags.FlagValues) -> None:
    """Flags shared by translate and evaluate; unset ones come from the run's config.decode."""
    define = {"flag_values": values}
    flags.DEFINE_multi_string(
        "workdir",
        None,
        "Training run directory; repeated: an ensemble of the runs (mean probabilities; one "
        "tokenizer; decoding settings from the first).",
        **define,
    )
    flags.mark_flag_as_required("workdir", flag_values=values)
    flags.DEFINE_string(
        "checkpoint",
        "latest",
        "'latest', 'averaged', a step, or 'snapshots/STEP' (saved on SIGUSR1).",
        **define,
    )
    flags.DEFINE_integer(
        "beam_size",
        None,
        f"Default: config.decode.beam_size ({PAPER.beam_size}).",
        lower_bound=1,
        **define,
    )
    flags.DEFINE_float(
        "alpha", None, f"Length penalty; default: config.decode.alpha ({PAPER.alpha}).", **define
    )
    flags.DEFINE_integer(
        "max_extra_len",
        None,
        f"Output <= input + this; default: config.decode.max_extra_len ({PAPER.max_extra_len}).",
        lower_bound=0,
        **define,
    )
    flags.DEFINE_integer(
        "max_src_len", None, "Truncate longer sources (tokens).", lower_bound=1, **define
    )
    flags.DEFINE_integer("batch_size", 64, "Sentences per batch.", lower_bound=1, **define)
    define_cache_flags(values)


def decode_options(values: flags.FlagValues, run: RunConfig) -> dict[str, Any]:
    """translate_lines keyword arguments: the flags, else the run's config.decode."""

    def pick(name: str) -> Any:
        given = values[name].value
        return given if given is not None else getattr(run.decode, name)

    return {
        "beam_size": pick("beam_size"),
        "alpha": pick("alpha"),
        "max_extra_len": pick("max_extra_len"),
        "max_src_len": values.max_src_len,
        "batch_size": values.batch_size,
    }


def translate(
    values: flags.FlagValues, lines: list[str]
) -> tuple[RunConfig, dict[str, Any], list[str]]:
    """``lines`` translated with the runs and decoding flags of ``values``: ``(the first
    run's config, the decoding options used, the translations)``. The library's warnings
    are ``WARNING: message`` lines on stderr."""
    from transformer_jax.compilation_cache import use_cache_flags
    from transformer_jax.inference.runs import load_models
    from transformer_jax.inference.translation import translate_lines

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    use_cache_flags(values)
    run_config, config, params, tokenizer = load_models(values.workdir, values.checkpoint)
    options = decode_options(values, run_config)
    return run_config, options, translate_lines(config, params, tokenizer, lines, **options)


def read_lines(path: str | None) -> list[str]:
    """Lines of the UTF-8 file ``path``, or of stdin when ``path`` is None
    (:func:`transformer_jax.data.sources.split_lines`)."""
    from transformer_jax.data.sources import read_lines as read_lines_of
    from transformer_jax.data.sources import split_lines

    if path is None:
        return split_lines(sys.stdin.buffer.read(), "stdin")
    if not os.path.isfile(path):
        raise ValueError(f"input file {path!r} does not exist")
    return read_lines_of(path)
