"""From a run config and a workdir to a tokenizer and batches (what ``train.py`` calls).

The tokenizer is trained once on the training split and saved as
``{workdir}/tokenizer.model``; each split is prepared once into
``{data.data_dir or workdir/data_cache}/{split}-{key}/`` (:mod:`transformer_jax.data.prepared`),
keyed by the tokenizer and the data source, and read memory-mapped, so a restarted run
neither retrains nor re-encodes. :func:`prepare_data` prepares a run's splits (``train.py``
calls it on process 0 before training; ``python -m transformer_jax.data.prepare`` alone).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import shutil
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import jax
import numpy as np

from transformer_jax.data.batching import Batch, Batcher, EncodedPairs, TrainIterator, eval_batches
from transformer_jax.data.prepared import (
    CHUNK_PAIRS,
    check_vocabulary,
    open_sources,
    open_split,
    read_spool,
    source_texts,
    spool_pairs,
    write_sources,
    write_split,
)
from transformer_jax.data.sources import (
    Pair,
    ReadCounts,
    count_pairs,
    stream_pairs,
    text_path,
)
from transformer_jax.data.tokenizer import (
    Tokenizer,
    load_tokenizer,
    order_by_frequency,
    train_tokenizer,
)

TOKENIZER_FILE = "tokenizer.model"
CACHE_DIR = "data_cache"


def _count_target_words(pairs: Iterable[Pair], words: Counter[str]) -> Iterator[Pair]:
    """``pairs`` as they come, adding how often each word of the targets (split at spaces)
    occurs to ``words``, for ``order_by_frequency`` in the same pass over the split."""
    for pair in pairs:
        words.update(pair[1].split(" "))
        yield pair


def get_tokenizer(
    data_config: Any, workdir: str, vocab_size: int, target_vocab_size: int | None = None
) -> Tokenizer:
    """``{workdir}/tokenizer.model``, trained on both sides of the training split if absent.

    At most ``data.tokenizer_train_sentences`` sentences are kept, a reservoir sample of
    the streamed split. The vocabulary may come out smaller than ``vocab_size`` on a small
    corpus (see ``Tokenizer.vocab_size``). With ``target_vocab_size`` below ``vocab_size``
    its pieces are numbered by frequency on the target side (its words counted in the same
    pass over the split) and targets are encoded with the first ``target_vocab_size``.
    """
    path = os.path.join(workdir, TOKENIZER_FILE)
    if os.path.isfile(path):
        return load_tokenizer(path, target_vocab_size)
    split, counts = data_config.train_split, ReadCounts()
    pairs = stream_pairs(data_config, split, counts)
    if data_config.source == "tfds":  # kept for encoding: TFDS is read once
        spool = _spool_path(data_config, split, workdir)
        os.makedirs(os.path.dirname(spool), exist_ok=True)
        pairs = spool_pairs(pairs, spool, counts)
    target_words = None
    if target_vocab_size is not None and target_vocab_size < vocab_size:
        target_words = Counter()
        pairs = _count_target_words(pairs, target_words)
    return train_tokenizer(
        itertools.chain.from_iterable(pairs),
        path,
        vocab_size,
        max_sentences=data_config.tokenizer_train_sentences,
        seed=data_config.seed,
        target_words=target_words,
        target_vocab_size=target_vocab_size,
    )


def _origin(data_config: Any, split: str) -> dict[str, Any]:
    """What the pairs of ``split`` come from (text files by size and modification time)."""
    fields = ("source", "tfds_name", "text_dir", "src_lang", "tgt_lang")
    origin = {name: data_config.get(name) for name in fields}
    origin.update(split=split)
    if data_config.source == "text":  # an edited file is encoded again
        langs = (data_config.src_lang, data_config.tgt_lang)
        stats = [os.stat(text_path(data_config.text_dir, split, lang)) for lang in langs]
        origin["files"] = [(stat.st_size, stat.st_mtime_ns) for stat in stats]
    return origin


def _key(origin: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(origin, sort_keys=True).encode()).hexdigest()[:16]


def _cache_key(data_config: Any, split: str, tokenizer: Tokenizer) -> str:
    origin = _origin(data_config, split)
    origin.update(tokenizer=tokenizer.fingerprint)
    if tokenizer.target_vocab_size is not None:
        origin["target_vocab_size"] = tokenizer.target_vocab_size
    return _key(origin)


def _data_dir(data_config: Any, workdir: str) -> str:
    return data_config.get("data_dir") or os.path.join(workdir, CACHE_DIR)


def _spool_path(data_config: Any, split: str, workdir: str) -> str:
    """Where the pairs of a TFDS split read to train the tokenizer are kept for encoding."""
    name = f"{split}-{_key(_origin(data_config, split))}.spool"
    return os.path.join(_data_dir(data_config, workdir), name)


def _pairs(data_config: Any, split: str, workdir: str, counts: ReadCounts) -> Any:
    """The pairs of ``split``: from the spool of a TFDS split where there is one (so a
    first start reads TFDS once), else from the source."""
    spool = _spool_path(data_config, split, workdir)
    if data_config.source == "tfds" and os.path.isdir(spool):
        return read_spool(spool, counts)
    return stream_pairs(data_config, split, counts)


def prepared_path(data_config: Any, split: str, tokenizer: Tokenizer, workdir: str) -> str:
    """Where ``split`` is prepared: ``{data.data_dir or workdir/data_cache}/{split}-{key}``."""
    directory = _data_dir(data_config, workdir)
    return os.path.join(directory, f"{split}-{_cache_key(data_config, split, tokenizer)}")


def encode_pairs(tokenizer: Tokenizer, pairs: list[tuple[str, str]]) -> EncodedPairs:
    src = tokenizer.encode_batch([s for s, _ in pairs])
    tgt = tokenizer.encode_targets([t for _, t in pairs])
    return EncodedPairs.from_lists(src, tgt)


def sample_sources(
    tokenizer: Tokenizer,
    sources: tuple[np.ndarray, np.ndarray],
    plain: EncodedPairs,
    dropout: float,
    seed: int,
    epoch: int,
    chunk_pairs: int = CHUNK_PAIRS,
) -> EncodedPairs:
    """``plain`` with its sources (``open_sources``' bytes and offsets) under BPE-dropout,
    sampled anew for each ``(seed, epoch)``, ``chunk_pairs`` sentences at a time (chunk k
    with a seed of ``(seed, epoch, k)``); the targets keep the one segmentation the model is
    scored and decodes in."""

    def chunks() -> Iterator[list[list[int]]]:
        for k, first in enumerate(range(0, len(plain), chunk_pairs)):
            texts = source_texts(sources, first, min(first + chunk_pairs, len(plain)))
            sample_seed = int(np.random.default_rng([seed, epoch, k]).integers(2**31))
            yield tokenizer.encode_sampled(texts, dropout, sample_seed)

    return plain.with_sources(chunks())


def prepared_sources(
    data_config: Any, tokenizer: Tokenizer, workdir: str
) -> tuple[np.ndarray, np.ndarray]:
    """The source sentences of the prepared training split (for BPE-dropout), memory-mapped;
    written into it first if absent."""
    split = data_config.train_split
    path = prepare_split(data_config, split, tokenizer, workdir)
    if open_sources(path) is None:
        write_sources(path, _pairs(data_config, split, workdir, ReadCounts()))
    sources = open_sources(path)
    pairs = open_split(path)[1]["pairs"]
    if sources is None or len(sources[1]) != pairs:
        found = "none" if sources is None else len(sources[1])
        raise ValueError(
            f"{path}/sources holds {found} sentences for {pairs} pairs: delete that directory "
            "to write it anew"
        )
    return sources


def _check_target_order(
    split: str, tokenizer: Tokenizer, workdir: str, words: Counter[str], path: str
) -> None:
    """ValueError (and the prepared split at ``path`` removed) unless the tokenizer numbers
    its pieces for the target ``words`` of ``split``."""
    if order_by_frequency(tokenizer.model_proto, words) != tokenizer.model_proto:
        shutil.rmtree(path, ignore_errors=True)
        raise ValueError(
            f"{os.path.join(workdir, TOKENIZER_FILE)} does not number its pieces for the "
            f"targets of {split!r}, so model.tgt_vocab_size={tokenizer.target_vocab_size} "
            "would keep other pieces than the most frequent: train with another --workdir "
            "(or without model.tgt_vocab_size)"
        )


def prepare_split(
    data_config: Any,
    split: str,
    tokenizer: Tokenizer,
    workdir: str,
    chunk_pairs: int = CHUNK_PAIRS,
) -> str:
    """Prepare ``split`` unless it is (a damaged one is rebuilt); its directory."""
    path = prepared_path(data_config, split, tokenizer, workdir)
    if os.path.isdir(path):
        try:
            open_split(path)
            return path
        except ValueError as e:
            print(f"warning: {e}; rebuilding it")
            shutil.rmtree(path, ignore_errors=True)
    counts, words = ReadCounts(), Counter()
    pairs = _pairs(data_config, split, workdir, counts)
    checked = split == data_config.train_split and tokenizer.target_vocab_size is not None
    if checked:  # the words of the pass that encodes
        pairs = _count_target_words(pairs, words)
    info = write_split(
        path,
        pairs,
        counts,
        lambda chunk: encode_pairs(tokenizer, chunk),
        tokenizer.vocab_size,
        chunk_pairs=chunk_pairs,
        total=count_pairs(data_config, split),
        desc=f"preparing {split}",
    )
    if checked:
        _check_target_order(split, tokenizer, workdir, words, path)
    if data_config.source == "tfds":
        shutil.rmtree(_spool_path(data_config, split, workdir), ignore_errors=True)
    print(
        f"{split}: {info['pairs']} pairs prepared in {path} ({info['skipped_empty']} skipped "
        f"for an empty side, {info['replaced_lines']} lines with undecodable bytes replaced "
        "by U+FFFD)"
    )
    return path


def run_splits(data_config: Any, final_test: bool) -> list[str]:
    """The splits a run reads: training, dev, and test when ``train.final_test``."""
    test = [data_config.test_split] if final_test else []
    return [data_config.train_split, data_config.eval_split, *test]


def prepare_data(data_config: Any, workdir: str, tokenizer: Tokenizer, splits: list[str]) -> None:
    """Prepare each of ``splits`` that is not prepared yet (with the training sources when
    ``data.bpe_dropout`` resamples them)."""
    for split in dict.fromkeys(splits):
        prepare_split(data_config, split, tokenizer, workdir)
    if data_config.bpe_dropout and data_config.train_split in splits:
        prepared_sources(data_config, tokenizer, workdir)


def encoded_split(data_config: Any, split: str, tokenizer: Tokenizer, workdir: str) -> EncodedPairs:
    """Token ids of all pairs of ``split``, memory-mapped from its prepared directory
    (prepared first if absent); ``read_counts`` holds what reading skipped or replaced."""
    path = prepare_split(data_config, split, tokenizer, workdir)
    encoded, info = open_split(path)
    check_vocabulary(path, info, tokenizer.vocab_size)
    counts = {k: int(info[k]) for k in ReadCounts().as_dict()}
    return dataclasses.replace(encoded, read_counts=counts)


def make_batcher(
    data_config: Any, encoded: EncodedPairs, num_shards: int, packing: bool | None = None
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
    data_config: Any,
    workdir: str,
    tokenizer: Tokenizer,
    num_shards: int,
    state: dict[str, int] | None = None,
) -> TrainIterator:
    """Training batches of ``data.train_split``; ``state`` is a saved ``get_state()``.

    With ``data.bpe_dropout`` > 0 every epoch's sources are segmented anew under BPE-dropout.
    """
    encoded = encoded_split(data_config, data_config.train_split, tokenizer, workdir)
    resample = None
    if data_config.bpe_dropout:
        sources = prepared_sources(data_config, tokenizer, workdir)
        args = (tokenizer, sources, encoded, data_config.bpe_dropout, data_config.seed)
        resample = lambda epoch: sample_sources(*args, epoch)  # noqa: E731
    batcher = make_batcher(data_config, encoded, num_shards)
    iterator = TrainIterator(batcher, data_config.seed, resample=resample)
    if state is not None:
        iterator.set_state(state)
    return iterator


def eval_split_batches(
    data_config: Any, workdir: str, tokenizer: Tokenizer, num_shards: int, split: str | None = None
) -> tuple[list[Batch], dict[str, int]]:
    """Every pair of ``split`` (default ``data.eval_split``) once, batched like training
    (packed or bucketed), and the counts of pairs kept and dropped as too long."""
    split = split or data_config.eval_split
    encoded = encoded_split(data_config, split, tokenizer, workdir)
    batcher = make_batcher(data_config, encoded, num_shards)
    counts = {"pairs": len(batcher.kept), "dropped_too_long": batcher.dropped_too_long}
    return eval_batches(batcher), counts
