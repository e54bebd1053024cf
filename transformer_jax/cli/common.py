"""What the translate and evaluate commands share: loading a run, decoding flags, reading lines."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from transformer_jax.data.sources import read_lines as read_lines_of
from transformer_jax.data.sources import split_lines
from transformer_jax.data.tokenizer import Tokenizer, load_tokenizer
from transformer_jax.model.config import TransformerConfig, from_config_dict
from transformer_jax.training.checkpoints import load_run, parse_checkpoint
from transformer_jax.training.schema import resolve_auto

log = logging.getLogger(__name__)


def load(workdir: str, checkpoint: str) -> tuple[Any, TransformerConfig, Any, Tokenizer]:
    """``(run config, model config, params, tokenizer)`` of a workdir; ValueError if absent.

    ``checkpoint`` is ``'latest'``, ``'averaged'``, a step number (as text) or
    ``'snapshots/STEP'``.
    """
    if not os.path.isdir(workdir):
        raise ValueError(f"workdir {workdir!r} does not exist")
    parse_checkpoint(checkpoint)  # a bad name fails before anything is read
    tokenizer = load_tokenizer(os.path.join(workdir, "tokenizer.model"))
    run, params, step = load_run(workdir, checkpoint)
    log.info("loaded %s checkpoint (step %d) from %s", checkpoint, step, workdir)
    model = resolve_auto(from_config_dict(run.model))  # 'auto' choices: this host's
    return run, model, params, Tokenizer(tokenizer.model_proto, model.tgt_vocab)


def load_models(
    workdirs: Sequence[str], checkpoint: str
) -> tuple[Any, TransformerConfig | list[TransformerConfig], Any, Tokenizer]:
    """:func:`load` of one workdir, or of several as an ensemble: ``(the first run's config,
    [model configs], [params], tokenizer)``; ValueError unless they share one tokenizer."""
    if len(workdirs) == 1:
        return load(workdirs[0], checkpoint)
    loaded = [load(workdir, checkpoint) for workdir in workdirs]
    tokenizer = shared_tokenizer(workdirs, loaded[0][1].tgt_vocab)
    return loaded[0][0], [m[1] for m in loaded], [m[2] for m in loaded], tokenizer


def shared_tokenizer(workdirs: Sequence[str], target_vocab_size: int | None = None) -> Tokenizer:
    """The tokenizer of the runs in ``workdirs`` (targets limited to ``target_vocab_size``
    pieces: the runs' ``model.tgt_vocab_size``); ValueError unless their ``tokenizer.model``
    files are the same."""
    paths = [os.path.join(workdir, "tokenizer.model") for workdir in workdirs]
    tokenizer = load_tokenizer(paths[0], target_vocab_size)
    with open(paths[0], "rb") as f:
        first = f.read()
    for path in paths[1:]:
        if not os.path.isfile(path):
            raise ValueError(f"{path} does not exist: is {os.path.dirname(path)} a training run?")
        with open(path, "rb") as f:
            if f.read() != first:
                raise ValueError(
                    f"{path} differs from {paths[0]}: an ensemble's runs must share one tokenizer"
                )
    return tokenizer


def add_decode_flags(parser: argparse.ArgumentParser) -> None:
    """Flags shared with ``transformer_jax.evaluate``; unset ones come from config.decode."""
    parser.add_argument(
        "--workdir",
        required=True,
        action="append",
        help="training run directory; repeated: an ensemble of the runs (mean probabilities; "
        "one tokenizer; decoding settings from the first)",
    )
    parser.add_argument(
        "--checkpoint",
        default="latest",
        help="'latest' (default), 'averaged', a step, or 'snapshots/STEP' (saved on SIGUSR1)",
    )
    parser.add_argument("--beam_size", type=int, help="default: config.decode.beam_size (4)")
    parser.add_argument("--alpha", type=float, help="length penalty; default: config (0.6)")
    parser.add_argument("--max_extra_len", type=int, help="output <= input + this (default 50)")
    parser.add_argument("--max_src_len", type=int, help="truncate longer sources (tokens)")
    parser.add_argument("--batch_size", type=int, default=64, help="sentences per batch")


def decode_options(args: argparse.Namespace, run: Any) -> dict[str, Any]:
    """translate_lines keyword arguments: the flags, else the run's config.decode."""
    decode = run.get("decode", {})
    pick = lambda flag, key, default: (  # noqa: E731
        getattr(args, flag) if getattr(args, flag) is not None else decode.get(key, default)
    )
    return {
        "beam_size": pick("beam_size", "beam_size", 4),
        "alpha": pick("alpha", "alpha", 0.6),
        "max_extra_len": pick("max_extra_len", "max_extra_len", 50),
        "max_src_len": args.max_src_len,
        "batch_size": args.batch_size,
    }


def read_lines(path: str | None) -> list[str]:
    """Lines of the UTF-8 file ``path``, or of stdin when ``path`` is None
    (:func:`transformer_jax.data.sources.split_lines`)."""
    if path is None:
        return split_lines(sys.stdin.buffer.read(), "stdin")
    if not os.path.isfile(path):
        raise ValueError(f"input file {path!r} does not exist")
    return read_lines_of(path)
