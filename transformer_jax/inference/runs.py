"""A trained run's files for decoding: its config, parameters and tokenizer, of one workdir or
of several decoded as an ensemble."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from transformer_jax.data.tokenizer import Tokenizer, load_tokenizer
from transformer_jax.model.config import TransformerConfig
from transformer_jax.training.checkpoints import load_run, parse_checkpoint
from transformer_jax.training.schema import RunConfig, resolve_auto

log = logging.getLogger(__name__)


def load(workdir: str, checkpoint: str) -> tuple[RunConfig, TransformerConfig, Any, Tokenizer]:
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
    model = resolve_auto(run.model)  # 'auto' choices: this host's
    return run, model, params, Tokenizer(tokenizer.model_proto, model.tgt_vocab)


def load_models(
    workdirs: Sequence[str], checkpoint: str
) -> tuple[RunConfig, TransformerConfig | list[TransformerConfig], Any, Tokenizer]:
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
