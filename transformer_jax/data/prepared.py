"""Prepared (binarized) splits: a split's token ids encoded once and read memory-mapped.

A prepared split is a directory holding ``src.npy`` and ``tgt.npy`` (every pair's token ids
end to end, in the narrowest dtype: uint16 below 65,536 pieces, else int32),
``src_offsets.npy`` and ``tgt_offsets.npy`` (int64, pair i is ``src[src_offsets[i]:
src_offsets[i + 1]]``; the lengths are their differences) and ``info.json`` (the pair
count and what reading skipped or replaced). Every process maps the same files
(``np.load(mmap_mode='r')``), so opening a split costs the same at any corpus size and the
pages are shared by the processes of a host.

:func:`write_split` encodes ``chunk_pairs`` pairs at a time into
``{path}.partial-{chunk_pairs}/chunk-K.npz`` (each file under a temporary name, then
renamed), so memory is bounded by a chunk and an interrupted preparation resumes after the
chunks it finished; the chunks are then copied into a temporary directory renamed to
``path``, so a reader sees no split or a whole one.

:func:`write_sources` adds ``sources/`` to a prepared training split for BPE-dropout, which
segments every epoch's sources anew: their UTF-8 bytes end to end and int64 end offsets,
mapped like the ids, so no process holds the sentences.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from tqdm import tqdm

from transformer_jax.data.batching import EncodedPairs
from transformer_jax.data.sources import Pair, ReadCounts

CHUNK_PAIRS = 50_000
INFO_FILE = "info.json"
ARRAYS = ("src", "src_offsets", "tgt", "tgt_offsets")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (below 65,536 pieces), else int32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


def _chunks(pairs: Iterable[Pair], size: int) -> Iterator[list[Pair]]:
    iterator = iter(pairs)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def _write_chunk(path: str, encoded: EncodedPairs, dtype: np.dtype) -> None:
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as f:
        np.savez(
            f,
            src=encoded.src.astype(dtype),
            src_offsets=encoded.src_offsets,
            tgt=encoded.tgt.astype(dtype),
            tgt_offsets=encoded.tgt_offsets,
        )
    os.replace(tmp, path)


def write_split(
    path: str,
    pairs: Iterable[Pair],
    counts: ReadCounts,
    encode: Callable[[list[Pair]], EncodedPairs],
    vocab_size: int,
    *,
    chunk_pairs: int = CHUNK_PAIRS,
    total: int | None = None,
    desc: str = "",
) -> dict[str, Any]:
    """Encode ``pairs`` (``encode`` maps a chunk to its ids) into a prepared split at
    ``path``, resuming the chunks of an interrupted call; returns its ``info.json``.

    ``counts`` is filled as ``pairs`` is read; ``total`` (lines, or None) sizes the bar.
    """
    partial = f"{path}.partial-{chunk_pairs}"
    os.makedirs(partial, exist_ok=True)
    dtype = token_dtype(vocab_size)
    files = []
    bar = tqdm(total=total, desc=desc or os.path.basename(path), unit=" pairs", mininterval=1)
    with bar:  # counts the lines read: the pairs kept and those skipped
        for k, chunk in enumerate(_chunks(pairs, chunk_pairs)):
            files.append(os.path.join(partial, f"chunk-{k:06d}.npz"))
            if not os.path.isfile(files[-1]):
                _write_chunk(files[-1], encode(chunk), dtype)
            bar.update(k * chunk_pairs + len(chunk) + counts.skipped_empty - bar.n)
    info = {"pairs": 0, "dtype": dtype.name, **counts.as_dict()}
    _concatenate(files, path, dtype, info)
    shutil.rmtree(partial, ignore_errors=True)
    return info


def _concatenate(files: list[str], path: str, dtype: np.dtype, info: dict[str, Any]) -> None:
    """The chunk files end to end in a temporary directory renamed to ``path``."""
    sizes = np.zeros((len(files), 3), np.int64)  # pairs, source tokens, target tokens
    for k, file in enumerate(files):
        with np.load(file) as chunk:
            src_offsets, tgt_offsets = chunk["src_offsets"], chunk["tgt_offsets"]
        sizes[k] = len(src_offsets) - 1, src_offsets[-1], tgt_offsets[-1]
    pairs, src_tokens, tgt_tokens = sizes.sum(axis=0)
    info["pairs"] = int(pairs)
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    os.makedirs(tmp)
    shapes = {"src": src_tokens, "src_offsets": pairs + 1, "tgt": tgt_tokens}
    shapes["tgt_offsets"] = pairs + 1
    with contextlib.ExitStack() as stack:  # each file written front to back, a chunk at a time
        out = {}
        for name in ARRAYS:
            out[name] = stack.enter_context(open(os.path.join(tmp, f"{name}.npy"), "wb"))
            kind = np.dtype(np.int64) if name.endswith("_offsets") else dtype
            header = {"descr": np.lib.format.dtype_to_descr(kind), "shape": (int(shapes[name]),)}
            np.lib.format.write_array_header_1_0(out[name], {**header, "fortran_order": False})
        for name in ("src_offsets", "tgt_offsets"):
            out[name].write(np.zeros(1, np.int64).tobytes())
        done = np.zeros(3, np.int64)
        info["max_id"] = 0  # checked against the tokenizer's vocabulary when opened
        for file, size in zip(files, sizes, strict=True):
            with np.load(file) as chunk:
                for side, tokens in (("src", 1), ("tgt", 2)):
                    if chunk[side].size:
                        info["max_id"] = max(info["max_id"], int(chunk[side].max()))
                    out[side].write(chunk[side].astype(dtype).tobytes())
                    offsets = chunk[f"{side}_offsets"][1:] + done[tokens]
                    out[f"{side}_offsets"].write(offsets.astype(np.int64).tobytes())
            done += size
    with open(os.path.join(tmp, INFO_FILE), "w") as f:
        json.dump(info, f)
    try:
        os.rename(tmp, path)
    except OSError:  # another process prepared it meanwhile: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(path):
            raise


def open_split(path: str) -> tuple[EncodedPairs, dict[str, Any]]:
    """The prepared split at ``path``, memory-mapped, and its ``info.json``; ValueError
    naming the file if it is incomplete or inconsistent."""
    try:
        with open(os.path.join(path, INFO_FILE)) as f:
            info = json.load(f)
        arrays = {
            name: np.load(os.path.join(path, f"{name}.npy"), mmap_mode="r") for name in ARRAYS
        }
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(
            f"the prepared split {path} is unreadable ({type(e).__name__}: {e})"
        ) from None
    for side in ("src", "tgt"):
        offsets = arrays[f"{side}_offsets"]
        if len(offsets) != info.get("pairs", -2) + 1 or offsets[-1] != len(arrays[side]):
            raise ValueError(f"the prepared split {path} is inconsistent ({side}.npy)")
    return EncodedPairs(**arrays), info


def check_vocabulary(path: str, info: dict[str, Any], vocab_size: int) -> None:
    """ValueError naming the prepared split at ``path`` if its ids leave ``[0, vocab_size)``."""
    if info.get("max_id", 0) >= vocab_size:
        raise ValueError(
            f"the prepared split {path} holds id {info['max_id']} outside the tokenizer's "
            f"vocabulary [0, {vocab_size}): delete it to prepare the split anew"
        )


SOURCES = "sources"  # the source sentences of a prepared split, for BPE-dropout


def _write_texts(
    tmp: str, chunks: Iterable[list[Any]], texts: Callable[[list[Any]], list[str]]
) -> Iterator[list[Any]]:
    """Each of ``chunks`` passed through once its ``texts`` are appended to ``{tmp}/text.bin``
    (UTF-8, end to end) and their int64 end offsets to ``{tmp}/ends.bin``."""
    with open(f"{tmp}/text.bin", "wb") as text, open(f"{tmp}/ends.bin", "wb") as ends:
        end = 0
        for chunk in chunks:
            encoded = [s.encode() for s in texts(chunk)]
            text.write(b"".join(encoded))
            offsets = end + np.cumsum([len(e) for e in encoded], dtype=np.int64)
            ends.write(offsets.tobytes())
            end = int(offsets[-1]) if len(offsets) else end
            yield chunk


def _map_texts(path: str) -> tuple[np.ndarray, np.ndarray]:
    """The bytes and end offsets :func:`_write_texts` wrote in ``path``, memory-mapped."""
    mapped = lambda name, dtype: (  # noqa: E731
        np.memmap(os.path.join(path, name), dtype, "r")
        if os.path.getsize(os.path.join(path, name))
        else np.zeros(0, dtype)
    )
    return mapped("text.bin", np.uint8), mapped("ends.bin", np.int64)


def write_sources(path: str, pairs: Iterable[Pair]) -> None:
    """``{path}/sources``: the source sentences of ``pairs`` (the pairs of the prepared split
    at ``path``, in order), written a chunk at a time into a directory renamed into place."""
    tmp = os.path.join(path, f"{SOURCES}.{uuid.uuid4().hex}.tmp")
    os.makedirs(tmp)
    try:
        sources = lambda chunk: [source for source, _ in chunk]  # noqa: E731
        for _chunk in _write_texts(tmp, _chunks(pairs, CHUNK_PAIRS), sources):
            pass
        if not os.path.isdir(os.path.join(path, SOURCES)):  # else another process wrote it
            os.replace(tmp, os.path.join(path, SOURCES))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def open_sources(path: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The source sentences of the prepared split at ``path`` (UTF-8 bytes and end offsets,
    memory-mapped), or None if :func:`write_sources` has not written them."""
    directory = os.path.join(path, SOURCES)
    return _map_texts(directory) if os.path.isdir(directory) else None


def source_texts(sources: tuple[np.ndarray, np.ndarray], first: int, stop: int) -> list[str]:
    """Sentences ``first`` to ``stop - 1`` of ``open_sources``' bytes and end offsets."""
    text, ends = sources
    begin = int(ends[first - 1]) if first else 0
    bounds = np.asarray(ends[first:stop]) - begin
    data = bytes(text[begin : begin + int(bounds[-1])]) if len(bounds) else b""
    starts = [0, *bounds[:-1].tolist()]
    return [data[a:b].decode() for a, b in zip(starts, bounds.tolist(), strict=True)]


def spool_pairs(pairs: Iterable[Pair], path: str, counts: ReadCounts) -> Iterator[Pair]:
    """``pairs`` passed through and written to a spool at ``path`` (a directory: the
    UTF-8 bytes of every sentence end to end, their int64 end offsets, and ``counts`` once
    ``pairs`` is exhausted), so that a second pass reads local files, not the source.
    The directory appears, renamed from a temporary one, only when every pair is written."""
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    os.makedirs(tmp)
    try:
        both = lambda chunk: [s for pair in chunk for s in pair]  # noqa: E731
        for chunk in _write_texts(tmp, _chunks(pairs, CHUNK_PAIRS), both):
            yield from chunk
        with open(f"{tmp}/{INFO_FILE}", "w") as f:
            json.dump(counts.as_dict(), f)
        if not os.path.isdir(path):  # else another process spooled it meanwhile
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_spool(path: str, counts: ReadCounts) -> Iterator[Pair]:
    """The pairs of a spool written by :func:`spool_pairs`, its counts added to ``counts``."""
    with open(os.path.join(path, INFO_FILE)) as f:
        saved = json.load(f)
    counts.skipped_empty += saved["skipped_empty"]
    counts.replaced_lines += saved["replaced_lines"]
    text, ends = _map_texts(path)
    for i in range(0, len(ends), 2):
        start = int(ends[i - 1]) if i else 0
        middle, stop = int(ends[i]), int(ends[i + 1])
        yield bytes(text[start:middle]).decode(), bytes(text[middle:stop]).decode()
