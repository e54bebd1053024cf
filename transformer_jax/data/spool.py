"""A split's pairs kept on local disk, read once from their source (TFDS, text files): the
UTF-8 bytes of every sentence end to end, a pair's source then its target, their int64 end
offsets (memory-mapped when read) and what reading skipped or replaced. The tokenizer's
sample is drawn from it by index (:func:`texts_at`) and its chunks are encoded from it.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator

import numpy as np

from transformer_jax.data.prepared import (
    CHUNK_PAIRS,
    INFO_FILE,
    chunked,
    map_texts,
    source_texts,
    write_json,
    write_texts,
)
from transformer_jax.data.sources import Pair, ReadCounts

SAMPLE_BLOCK = 4096  # sentences read at a time by texts_at


def write_spool(pairs: Iterable[Pair], path: str, counts: ReadCounts) -> None:
    """``pairs`` written to a spool at ``path``: a directory holding the UTF-8 bytes of every
    sentence end to end (a pair's source, then its target), their int64 end offsets, and
    ``counts`` once ``pairs`` is exhausted, so that later passes read local files, not the
    source. The directory appears, renamed from a temporary one, only when it is whole."""
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    os.makedirs(tmp)
    try:
        both = lambda chunk: [s for pair in chunk for s in pair]  # noqa: E731
        for _chunk in write_texts(tmp, chunked(pairs, CHUNK_PAIRS), both):
            pass
        write_json(f"{tmp}/{INFO_FILE}", counts.as_dict())
        if not os.path.isdir(path):  # else another process spooled it meanwhile
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def open_spool(path: str, counts: ReadCounts) -> tuple[np.ndarray, np.ndarray]:
    """The sentences of the spool at ``path`` (bytes and end offsets, memory-mapped: sentence
    2i is pair i's source, 2i + 1 its target), its counts added to ``counts``."""
    with open(os.path.join(path, INFO_FILE)) as f:
        saved = json.load(f)
    counts.skipped_empty += saved["skipped_empty"]
    counts.replaced_lines += saved["replaced_lines"]
    return map_texts(path)


def read_spool(path: str, counts: ReadCounts) -> Iterator[Pair]:
    """The pairs of the spool at ``path``, its counts added to ``counts``."""
    texts = open_spool(path, counts)
    for first in range(0, len(texts[1]), 2 * CHUNK_PAIRS):
        sentences = source_texts(texts, first, min(first + 2 * CHUNK_PAIRS, len(texts[1])))
        yield from zip(sentences[::2], sentences[1::2], strict=True)


def texts_at(texts: tuple[np.ndarray, np.ndarray], indices: np.ndarray) -> list[str]:
    """The sentences at the ascending ``indices`` of mapped bytes and end offsets, read
    ``SAMPLE_BLOCK`` sentences at a time."""
    text, ends = texts
    stops = np.asarray(ends[indices])
    starts = np.where(indices > 0, np.asarray(ends[np.maximum(indices - 1, 0)]), 0)
    sentences = []
    for a in range(0, len(indices), SAMPLE_BLOCK):
        first, last = starts[a : a + SAMPLE_BLOCK], stops[a : a + SAMPLE_BLOCK]
        data, base = bytes(text[first[0] : last[-1]]), int(first[0])
        bounds = zip((first - base).tolist(), (last - base).tolist(), strict=True)
        sentences.extend(data[x:y].decode() for x, y in bounds)
    return sentences
