"""From a run config and a workdir to a tokenizer and batches (what ``train.py`` calls).

The tokenizer is trained once on the training split and saved as
``{workdir}/tokenizer.model``; each split's token ids are cached in
``{workdir}/data_cache/{split}-{key}.npz``, keyed by the tokenizer and the data source, so a
restarted run neither retrains nor re-encodes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import uuid
import zipfile
from typing import Any

import jax
import numpy as np

from transformer_jax.data.batching import Batch, Batcher, EncodedPairs, TrainIterator, eval_batches
from transformer_jax.data.sources import load_pairs, text_path
from transformer_jax.data.tokenizer import (
    Tokenizer,
    load_tokenizer,
    order_by_frequency,
    train_tokenizer,
)

TOKENIZER_FILE = "tokenizer.model"
CACHE_DIR = "data_cache"


def get_tokenizer(
    data_config: Any, workdir: str, vocab_size: int, target_vocab_size: int | None = None
) -> Tokenizer:
    """``{workdir}/tokenizer.model``, trained on both sides of the training split if absent.

    At most ``data.tokenizer_train_sentences`` sentences are sampled. The vocabulary may
    come out smaller than ``vocab_size`` on a small corpus (see ``Tokenizer.vocab_size``).
    With ``target_vocab_size`` below ``vocab_size`` its pieces are numbered by frequency on
    the target side and targets are encoded with the first ``target_vocab_size``.
    """
    path = os.path.join(workdir, TOKENIZER_FILE)
    if os.path.isfile(path):
        return load_tokenizer(path, target_vocab_size)
    pairs = load_pairs(data_config, data_config.train_split)
    targets = None
    if target_vocab_size is not None and target_vocab_size < vocab_size:
        targets = [t for _, t in pairs]
    return train_tokenizer(
        itertools.chain.from_iterable(pairs),
        path,
        vocab_size,
        max_sentences=data_config.tokenizer_train_sentences,
        seed=data_config.seed,
        targets=targets,
        target_vocab_size=target_vocab_size,
    )


def _cache_key(data_config: Any, split: str, tokenizer: Tokenizer) -> str:
    fields = ("source", "tfds_name", "text_dir", "src_lang", "tgt_lang")
    origin = {name: data_config.get(name) for name in fields}
    origin.update(split=split, tokenizer=tokenizer.fingerprint)
    if tokenizer.target_vocab_size is not None:
        origin["target_vocab_size"] = tokenizer.target_vocab_size
    if data_config.source == "text":  # an edited file is encoded again
        langs = (data_config.src_lang, data_config.tgt_lang)
        stats = [os.stat(text_path(data_config.text_dir, split, lang)) for lang in langs]
        origin["files"] = [(stat.st_size, stat.st_mtime_ns) for stat in stats]
    return hashlib.sha1(json.dumps(origin, sort_keys=True).encode()).hexdigest()[:16]


def encode_pairs(tokenizer: Tokenizer, pairs: list[tuple[str, str]]) -> EncodedPairs:
    src = tokenizer.encode_batch([s for s, _ in pairs])
    tgt = tokenizer.encode_targets([t for _, t in pairs])
    return EncodedPairs.from_lists(src, tgt)


def sample_sources(
    tokenizer: Tokenizer,
    sources: list[str],
    plain: EncodedPairs,
    dropout: float,
    seed: int,
    epoch: int,
) -> EncodedPairs:
    """``plain`` (the pairs of ``sources``) with the sources under BPE-dropout, sampled anew
    for each ``(seed, epoch)``; the targets keep the one segmentation the model is scored and
    decodes in."""
    sample_seed = int(np.random.default_rng([seed, epoch]).integers(2**31))
    return plain.with_sources(tokenizer.encode_sampled(sources, dropout, sample_seed))


def _in_vocab(encoded: EncodedPairs, tokenizer: Tokenizer, path: str) -> EncodedPairs:
    """``encoded``, whose ids must lie in the tokenizer's vocabulary (one line otherwise)."""
    for side in ("src", "tgt"):
        ids = getattr(encoded, side)
        if ids.size and not 0 <= int(ids.min()) <= int(ids.max()) < tokenizer.vocab_size:
            raise ValueError(
                f"{path}: the {side} ids leave the tokenizer's vocabulary [0, "
                f"{tokenizer.vocab_size}); delete the file to encode the split anew"
            )
    return encoded


def encoded_split(data_config: Any, split: str, tokenizer: Tokenizer, workdir: str) -> EncodedPairs:
    """Token ids of all pairs of ``split``, from the workdir cache when present."""
    path = os.path.join(
        workdir, CACHE_DIR, f"{split}-{_cache_key(data_config, split, tokenizer)}.npz"
    )
    if os.path.isfile(path):
        try:
            with np.load(path) as cached:
                return _in_vocab(
                    EncodedPairs(**{n: cached[n] for n in cached.files}), tokenizer, path
                )
        except (OSError, ValueError, EOFError, KeyError, TypeError, zipfile.BadZipFile) as e:
            print(
                f"warning: the data cache {path} is unreadable ({type(e).__name__}); rebuilding it"
            )
    pairs = load_pairs(data_config, split)
    if split == data_config.train_split and tokenizer.target_vocab_size is not None:
        targets = [t for _, t in pairs]
        if order_by_frequency(tokenizer.model_proto, targets) != tokenizer.model_proto:
            raise ValueError(
                f"{os.path.join(workdir, TOKENIZER_FILE)} does not number its pieces for the "
                f"targets of {split!r}, so model.tgt_vocab_size={tokenizer.target_vocab_size} "
                "would keep other pieces than the most frequent: train with another --workdir "
                "(or without model.tgt_vocab_size)"
            )
    encoded = encode_pairs(tokenizer, pairs)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"  # unique across hosts sharing the workdir
    with open(tmp, "wb") as f:
        np.savez(
            f, **{k: getattr(encoded, k) for k in ("src", "src_offsets", "tgt", "tgt_offsets")}
        )
    os.replace(tmp, path)
    return encoded


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
        sources = [s for s, _ in load_pairs(data_config, data_config.train_split)]
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
