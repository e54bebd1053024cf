"""Prepared (binarized) splits, the on-disk format: written once, checked, read memory-mapped.

A prepared split is a directory holding ``src.npy`` and ``tgt.npy`` (every pair's token ids
end to end, in the narrowest dtype: uint16 below 65,536 pieces, else int32),
``src_offsets.npy`` and ``tgt_offsets.npy`` (int64, pair i is ``src[src_offsets[i]:
src_offsets[i + 1]]``; the lengths are their differences) and ``info.json``: the pair count,
what reading skipped or replaced, the largest id, and each array file's size and CRC-32
(``files``). Every process maps the same files (``np.load(mmap_mode='r')``), so opening a
split costs the same at any corpus size and the pages are shared by the processes of a host.

:func:`write_split` appends encoded chunks, in order, to the four files of
``{path}.partial-{chunk_pairs}/`` and records after each chunk how far it got
(``progress.json``, written after the data reach the disk), so an interrupted preparation
resumes after its last whole chunk and nothing is copied: the disk holds the output once.
The ``.npy`` headers (of a fixed length) get their final shapes, ``info.json`` its
checksums, and the directory is renamed to ``path``, so a reader sees no split or a whole
one. One process writes a split at a time (``{path}.lock``).

:func:`open_split` checks each array file's size and CRC-32 the first time a process opens a
split (one pass over its files); a failure is :class:`DamagedSplit`, naming the file. A
split prepared before checksums were kept has them computed from its files and recorded
then, with a note.

:func:`write_sources` adds ``sources/`` to a prepared training split for BPE-dropout, which
segments every epoch's sources anew: their UTF-8 bytes end to end and int64 end offsets,
mapped like the ids, so no process holds the sentences (the same layout as a spool:
:mod:`transformer_jax.data.spool`).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import shutil
import sys
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

import numpy as np

from transformer_jax.data.batching import EncodedPairs
from transformer_jax.data.sources import Pair, ReadCounts

CHUNK_PAIRS = 50_000
INFO_FILE = "info.json"
PROGRESS_FILE = "progress.json"
ARRAYS = ("src", "src_offsets", "tgt", "tgt_offsets")
CHECK_BLOCK = 1 << 24  # bytes per CRC-32 step of a file
_verified: set[tuple[Any, ...]] = set()  # the splits this process has checked, by file identity


class DamagedSplit(ValueError):
    """A file of a prepared split is missing, unreadable, inconsistent or fails its CRC-32."""

    def __init__(self, file: str, reason: str, hint: str = ""):
        super().__init__(f"prepared data damaged: {file} ({reason})" + (hint and f"; {hint}"))
        self.file, self.reason = file, reason


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (below 65,536 pieces), else int32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


def chunked(pairs: Iterable[Pair], size: int) -> Iterator[list[Pair]]:
    iterator = iter(pairs)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (waiting for another holder)."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_json(path: str, value: dict[str, Any]) -> None:
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def _header(f: BinaryIO, dtype: np.dtype, length: int) -> int:
    """Write the ``.npy`` header of ``length`` items of ``dtype`` at the start of ``f``; its
    size (the same for every length: numpy pads it for a growing shape)."""
    f.seek(0)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False}
    np.lib.format.write_array_header_1_0(f, {**header, "shape": (int(length),)})
    return f.tell()


def _dtypes(dtype: np.dtype) -> dict[str, np.dtype]:
    return {name: np.dtype(np.int64) if "offsets" in name else dtype for name in ARRAYS}


def _sizes(progress: dict[str, int], dtype: np.dtype) -> dict[str, int]:
    """The bytes of each file of a split written as far as ``progress`` says."""
    lengths = {"src": progress["src"], "tgt": progress["tgt"]}
    lengths.update(dict.fromkeys(ARRAYS[1::2], progress["pairs"] + 1))
    kinds = _dtypes(dtype)
    return {name: progress["header"] + lengths[name] * kinds[name].itemsize for name in ARRAYS}


def _resumable(partial: str, dtype: np.dtype) -> dict[str, int] | None:
    """The progress recorded in ``partial`` if every file holds at least what it says."""
    try:
        with open(os.path.join(partial, PROGRESS_FILE)) as f:
            progress = json.load(f)
        sizes = _sizes(progress, dtype)
        if all(os.path.getsize(os.path.join(partial, f"{n}.npy")) >= sizes[n] for n in ARRAYS):
            return progress
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _start(partial: str, dtype: np.dtype) -> dict[str, int]:
    """The progress of the split being written in ``partial``, its files cut to it; a new
    one (files of no pairs) where there is none to resume."""
    progress = _resumable(partial, dtype)
    if progress is None:
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
        progress = {"chunks": 0, "pairs": 0, "src": 0, "tgt": 0, "max_id": 0, "header": 0}
        for name, kind in _dtypes(dtype).items():
            with open(os.path.join(partial, f"{name}.npy"), "wb") as f:
                progress["header"] = _header(f, kind, 0)
                if kind == np.int64:
                    f.write(np.zeros(1, np.int64).tobytes())
        write_json(os.path.join(partial, PROGRESS_FILE), progress)
    for name, size in _sizes(progress, dtype).items():
        os.truncate(os.path.join(partial, f"{name}.npy"), size)
    return progress


def _append(
    files: dict[str, BinaryIO], encoded: EncodedPairs, progress: dict[str, int], dtype: np.dtype
) -> None:
    """``encoded`` written at the ends of ``files`` (its offsets continuing ``progress``)."""
    for side in ("src", "tgt"):
        tokens = np.asarray(getattr(encoded, side))
        offsets = np.asarray(getattr(encoded, f"{side}_offsets")[1:], np.int64) + progress[side]
        files[side].write(tokens.astype(dtype).tobytes())
        files[f"{side}_offsets"].write(offsets.tobytes())
        if tokens.size:
            progress["max_id"] = max(progress["max_id"], int(tokens.max()))
        progress[side] += len(tokens)
    progress["pairs"] += len(encoded)
    progress["chunks"] += 1
    for f in files.values():  # the data on disk before the progress says so
        f.flush()
        os.fsync(f.fileno())


def write_split(
    path: str,
    chunks: Callable[[int], Iterable[EncodedPairs]],
    counts: ReadCounts,
    vocab_size: int,
    *,
    chunk_pairs: int = CHUNK_PAIRS,
) -> dict[str, Any]:
    """Write the prepared split at ``path`` from ``chunks(done)``, the encoded chunks of
    ``chunk_pairs`` pairs after the first ``done`` (those an interrupted call wrote); its
    ``info.json``. ``counts`` is complete once the chunks are. If another process wrote
    ``path`` meanwhile, that split's ``info.json``."""
    dtype = token_dtype(vocab_size)
    partial = f"{path}.partial-{chunk_pairs}"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)  # a removed data_cache comes back
    with locked(f"{path}.lock"):
        if not os.path.isdir(path):
            _write_partial(partial, chunks, counts, dtype)
            os.rename(partial, path)
        with contextlib.suppress(FileNotFoundError):  # the contenders hold it or see path
            os.remove(f"{path}.lock")
    return _read_info(path)


def _write_partial(
    partial: str,
    chunks: Callable[[int], Iterable[EncodedPairs]],
    counts: ReadCounts,
    dtype: np.dtype,
) -> None:
    """The split of :func:`write_split` in ``partial``, resumed where its progress says."""
    progress = _start(partial, dtype)
    with contextlib.ExitStack() as stack:
        files = {
            name: stack.enter_context(open(os.path.join(partial, f"{name}.npy"), "r+b"))
            for name in ARRAYS
        }
        for f in files.values():
            f.seek(0, os.SEEK_END)
        for encoded in chunks(progress["chunks"]):
            _append(files, encoded, progress, dtype)
            write_json(os.path.join(partial, PROGRESS_FILE), progress)
        for name, size in _sizes(progress, dtype).items():
            kind = _dtypes(dtype)[name]
            length = (size - progress["header"]) // kind.itemsize
            if _header(files[name], kind, length) != progress["header"]:
                raise AssertionError(f"the .npy header of {name} changed its length")
    info = {"pairs": progress["pairs"], "dtype": dtype.name, **counts.as_dict()}
    info.update(max_id=progress["max_id"], files=_checksums(partial))
    write_json(os.path.join(partial, INFO_FILE), info)
    os.remove(os.path.join(partial, PROGRESS_FILE))


def _crc32(path: str) -> str:
    """The CRC-32 of the file at ``path`` (8 hex digits), read mapped a block at a time."""
    crc = 0
    if os.path.getsize(path):
        data = np.memmap(path, np.uint8, "r")
        for start in range(0, len(data), CHECK_BLOCK):
            crc = zlib.crc32(data[start : start + CHECK_BLOCK], crc)
        del data
    return f"{crc:08x}"


def _checksums(path: str) -> dict[str, dict[str, Any]]:
    """Each array file's size and CRC-32, as ``info.json`` records them."""
    files = {f"{name}.npy": os.path.join(path, f"{name}.npy") for name in ARRAYS}
    return {n: {"bytes": os.path.getsize(f), "crc32": _crc32(f)} for n, f in files.items()}


def _read_info(path: str) -> dict[str, Any]:
    file = os.path.join(path, INFO_FILE)
    try:
        with open(file) as f:
            info = json.load(f)
    except (OSError, ValueError) as e:
        raise DamagedSplit(file, f"unreadable: {type(e).__name__}: {e}") from None
    if not isinstance(info, dict) or not isinstance(info.get("pairs"), int):
        raise DamagedSplit(file, "not a prepared split's info")
    return info


def _verify(path: str, info: dict[str, Any]) -> dict[str, Any]:
    """``info`` once the array files of the split at ``path`` match its checksums (checked
    once per process and files); recorded now for a split prepared without them."""
    identity = []
    for name in ARRAYS:
        file = os.path.join(path, f"{name}.npy")
        try:
            stat = os.stat(file)
        except OSError as e:
            raise DamagedSplit(file, f"unreadable: {e.strerror}") from None
        identity.append((stat.st_ino, stat.st_size, stat.st_mtime_ns))
    key = (os.path.abspath(path), *identity)
    if key in _verified:
        return info
    if "files" not in info:
        info = _record_checksums(path, info)
    else:
        _check(path, info, [size for _, size, _ in identity])
    _verified.add(key)
    return info


def _check(path: str, info: dict[str, Any], sizes: list[int]) -> None:
    """:class:`DamagedSplit` unless the array files of ``sizes`` match ``info``'s record."""
    try:
        recorded = [
            (info["files"][f"{n}.npy"]["bytes"], info["files"][f"{n}.npy"]["crc32"]) for n in ARRAYS
        ]
    except (KeyError, TypeError):
        raise DamagedSplit(os.path.join(path, INFO_FILE), "its checksums are unreadable") from None
    files = [os.path.join(path, f"{name}.npy") for name in ARRAYS]
    for file, size, (written, _) in zip(files, sizes, recorded, strict=True):  # sizes first
        if size != written:
            raise DamagedSplit(file, f"{size} bytes where {written} were written")
    for file, (_, crc32) in zip(files, recorded, strict=True):
        if (crc := _crc32(file)) != crc32:
            raise DamagedSplit(file, f"CRC-32 {crc} where {crc32} was written")


def _record_checksums(path: str, info: dict[str, Any]) -> dict[str, Any]:
    """``info`` with the checksums of the files as they are, written to ``info.json`` where
    the directory is writable; one note line either way."""
    info = {**info, "files": _checksums(path)}
    try:
        write_json(os.path.join(path, INFO_FILE), info)
        done = "recorded now from its files"
    except OSError as e:
        done = f"computed from its files but not recorded ({e.strerror})"
    print(f"note: {path} was prepared without checksums: they are {done}", file=sys.stderr)
    return info


def open_split(path: str) -> tuple[EncodedPairs, dict[str, Any]]:
    """The prepared split at ``path``, memory-mapped, and its ``info.json``;
    :class:`DamagedSplit` naming the file that is missing, damaged or inconsistent."""
    info = _verify(path, _read_info(path))
    arrays = {}
    for name in ARRAYS:
        file = os.path.join(path, f"{name}.npy")
        try:
            arrays[name] = np.load(file, mmap_mode="r")
        except (OSError, ValueError, EOFError) as e:
            raise DamagedSplit(file, f"unreadable: {type(e).__name__}: {e}") from None
    for side in ("src", "tgt"):
        offsets = arrays[f"{side}_offsets"]
        if len(offsets) != info["pairs"] + 1 or offsets[-1] != len(arrays[side]):
            raise DamagedSplit(os.path.join(path, f"{side}.npy"), "inconsistent with its offsets")
    return EncodedPairs(**arrays), info


def check_vocabulary(path: str, info: dict[str, Any], vocab_size: int) -> None:
    """ValueError naming the prepared split at ``path`` if its ids leave ``[0, vocab_size)``."""
    if info.get("max_id", 0) >= vocab_size:
        raise ValueError(
            f"the prepared split {path} holds id {info['max_id']} outside the tokenizer's "
            f"vocabulary [0, {vocab_size}): delete it to prepare the split anew"
        )


SOURCES = "sources"  # the source sentences of a prepared split, for BPE-dropout


def write_texts(
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


def map_texts(path: str) -> tuple[np.ndarray, np.ndarray]:
    """The bytes and end offsets :func:`write_texts` wrote in ``path``, memory-mapped."""
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
        for _chunk in write_texts(tmp, chunked(pairs, CHUNK_PAIRS), sources):
            pass
        if not os.path.isdir(os.path.join(path, SOURCES)):  # else another process wrote it
            os.replace(tmp, os.path.join(path, SOURCES))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def open_sources(path: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The source sentences of the prepared split at ``path`` (UTF-8 bytes and end offsets,
    memory-mapped), or None if :func:`write_sources` has not written them."""
    directory = os.path.join(path, SOURCES)
    return map_texts(directory) if os.path.isdir(directory) else None


def source_texts(sources: tuple[np.ndarray, np.ndarray], first: int, stop: int) -> list[str]:
    """Sentences ``first`` to ``stop - 1`` of ``open_sources``' bytes and end offsets."""
    text, ends = sources
    begin = int(ends[first - 1]) if first else 0
    bounds = np.asarray(ends[first:stop]) - begin
    data = bytes(text[begin : begin + int(bounds[-1])]) if len(bounds) else b""
    starts = [0, *bounds[:-1].tolist()]
    return [data[a:b].decode() for a, b in zip(starts, bounds.tolist(), strict=True)]
