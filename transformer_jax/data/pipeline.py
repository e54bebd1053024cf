"""From a run's prepared splits to batches (what the training loop and the evaluator read).

Each split is opened memory-mapped from its prepared directory (prepared first where it is
not: :mod:`transformer_jax.data.preparation`) and batched by :class:`Batcher`; with
``data.bpe_dropout`` every epoch's sources are segmented anew from the prepared sentences,
ahead of time, into files of the workdir (:mod:`transformer_jax.data.resampled`).
"""

from __future__ import annotations

import dataclasses
import os

import jax

from transformer_jax.data.batching import Batch, Batcher, EncodedPairs, TrainIterator, eval_batches
from transformer_jax.data.config import DataConfig
from transformer_jax.data.preparation import (
    CACHE_DIR,
    prepare_split,
    prepared_path,
    prepared_sources,
    workers,
)
from transformer_jax.data.prepared import SOURCES, check_vocabulary, open_split
from transformer_jax.data.resampled import ResampledEpochs, resampled_dir
from transformer_jax.data.sources import ReadCounts
from transformer_jax.data.tokenizer import Tokenizer


def encoded_split(
    data_config: DataConfig, split: str, tokenizer: Tokenizer, workdir: str
) -> EncodedPairs:
    """Token ids of all pairs of ``split``, memory-mapped from its prepared directory
    (prepared first if absent); ``read_counts`` holds what reading skipped or replaced."""
    path = prepare_split(data_config, split, tokenizer, workdir)
    encoded, info = open_split(path)
    check_vocabulary(path, info, tokenizer.vocab_size)
    counts = {k: int(info[k]) for k in ReadCounts().as_dict()}
    return dataclasses.replace(encoded, read_counts=counts)


def make_batcher(
    data_config: DataConfig, encoded: EncodedPairs, num_shards: int, packing: bool | None = None
) -> Batcher:
    """A :class:`Batcher` from ``config.data``; this process's share of each batch."""
    return Batcher(
        encoded,
        tokens_per_batch=data_config.tokens_per_batch,
        max_len=data_config.max_len,
        packing=data_config.packing if packing is None else packing,
        num_shards=num_shards,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )


def train_iterator(
    data_config: DataConfig,
    workdir: str,
    tokenizer: Tokenizer,
    num_shards: int,
    state: dict[str, int] | None = None,
) -> TrainIterator:
    """Training batches of ``data.train_split``; ``state`` is a saved ``get_state()``.

    With ``data.bpe_dropout`` > 0 every epoch's sources are segmented anew under BPE-dropout
    by ``data.prepare_workers`` processes, the next epoch's while this one is read.
    """
    encoded = encoded_split(data_config, data_config.train_split, tokenizer, workdir)
    resample = None
    if data_config.bpe_dropout:
        prepared_sources(data_config, tokenizer, workdir)  # written first if absent
        path = prepared_path(data_config, data_config.train_split, tokenizer, workdir)
        dropout, seed = data_config.bpe_dropout, data_config.seed
        directory = resampled_dir(os.path.join(workdir, CACHE_DIR), path, dropout, seed)
        sources = os.path.join(path, SOURCES)
        args = (tokenizer, sources, encoded, dropout, seed, directory, workers(data_config))
        resample = ResampledEpochs(*args)
    batcher = make_batcher(data_config, encoded, num_shards)
    state = state or {"epoch": 0, "index": 0}
    iterator = TrainIterator(batcher, data_config.seed, int(state["epoch"]), resample=resample)
    iterator.set_state(state)
    return iterator


def eval_split_batches(
    data_config: DataConfig,
    workdir: str,
    tokenizer: Tokenizer,
    num_shards: int,
    split: str | None = None,
) -> tuple[list[Batch], dict[str, int]]:
    """Every pair of ``split`` (default ``data.eval_split``) once, batched like training
    (packed or bucketed), and the counts of pairs kept and dropped as too long."""
    split = split or data_config.eval_split
    encoded = encoded_split(data_config, split, tokenizer, workdir)
    batcher = make_batcher(data_config, encoded, num_shards)
    counts = {"pairs": len(batcher.kept), "dropped_too_long": batcher.dropped_too_long}
    return eval_batches(batcher), counts
