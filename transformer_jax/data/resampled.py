"""BPE-dropout's epochs segmented ahead of time into memory-mapped files.

Each epoch's sources are sampled anew (:meth:`Tokenizer.encode_sampled`) ``chunk_pairs``
sentences at a time, chunk k with draws from ``np.random.default_rng(chunk_seed(seed,
epoch, k))``, so an epoch's ids are a function of ``(seed, epoch)`` whatever the number of
processes. Worker processes (a fresh forkserver's, not forks of this process) write each
chunk to ``{directory}/epoch-{e}.partial/``; the chunks are then laid end to end into
``src.npy`` (the prepared split's dtype) and ``src_offsets.npy`` (int64) and the directory
is renamed to ``epoch-{e}``, so a complete epoch is reused by a resumed run and a partial
one is finished from its whole chunks. Every process of a host maps the same files (one
builds an epoch, under ``epoch-{e}.lock``; the others wait and map it). Opening epoch e
starts epoch e + 1 in the background and removes the files of the epochs before e.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import os
import shutil
import threading
import uuid

import numpy as np

from transformer_jax.data.batching import EncodedPairs
from transformer_jax.data.preparation import start_worker, worker_state
from transformer_jax.data.prepared import (
    CHUNK_PAIRS,
    locked,
    map_texts,
    source_texts,
    token_dtype,
)
from transformer_jax.data.tokenizer import Tokenizer

NICE = 10  # the workers' niceness: the training process's threads come first
STREAM = 0x42504544  # tags the draws of BPE-dropout apart from the epoch's order
_EPOCH = "epoch-"


def chunk_seed(seed: int, epoch: int, chunk: int) -> list[int]:
    """The seed of the draws of chunk ``chunk`` of epoch ``epoch`` under ``seed``."""
    return [seed, epoch, chunk, STREAM]


def resampled_dir(
    cache_dir: str, prepared: str, dropout: float, seed: int, chunk_pairs: int = CHUNK_PAIRS
) -> str:
    """Where the epochs of the prepared training split at ``prepared`` are written."""
    key = json.dumps([os.path.basename(prepared), dropout, seed, chunk_pairs])
    return os.path.join(cache_dir, f"resampled-{hashlib.sha1(key.encode()).hexdigest()[:16]}")


def _start_resampler(model_proto: bytes, parent: int) -> None:
    os.nice(NICE)
    start_worker(model_proto, None, parent)


def _sample_chunk(
    sources: str, first: int, stop: int, dropout: float, seed: list[int], out: str
) -> None:
    """Sentences ``first`` to ``stop - 1`` of the sources at ``sources`` sampled with
    ``seed``, written to ``out`` (ids in the prepared dtype and each sentence's length)."""
    tokenizer = worker_state["tokenizer"]
    if sources not in worker_state["spools"]:
        worker_state["spools"][sources] = map_texts(sources)
    texts = source_texts(worker_state["spools"][sources], first, stop)
    ids, lengths = tokenizer.encode_sampled(texts, dropout, seed)
    tmp = f"{out}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, ids=ids.astype(token_dtype(tokenizer.vocab_size)), lengths=lengths)
    os.replace(tmp, out)


def _assemble(partial: str, chunks: list[str], dtype: np.dtype) -> None:
    """The ``chunks`` of ``partial`` laid end to end into its ``src.npy`` (ids of ``dtype``)
    and ``src_offsets.npy``."""
    lengths = []
    for chunk in chunks:
        with np.load(chunk) as arrays:
            lengths.append(arrays["lengths"])
    pairs = sum(len(x) for x in lengths)
    offsets = np.lib.format.open_memmap(f"{partial}/src_offsets.npy", "w+", np.int64, (pairs + 1,))
    offsets[0] = 0
    np.cumsum(np.concatenate([np.zeros(0, np.int64), *lengths]), out=offsets[1:])
    src = np.lib.format.open_memmap(f"{partial}/src.npy", "w+", dtype, (int(offsets[-1]),))
    for chunk, begin in zip(chunks, offsets[np.cumsum([0, *map(len, lengths)])[:-1]], strict=True):
        with np.load(chunk) as arrays:
            ids = arrays["ids"]
        src[begin : begin + len(ids)] = ids
    offsets.flush()
    src.flush()


class ResampledEpochs:
    """``self(epoch)``: the pairs ``plain`` with the sources of ``epoch`` under BPE-dropout
    ``dropout`` (memory-mapped from ``directory``), the resampling function of a
    :class:`~transformer_jax.data.batching.TrainIterator`; ``processes`` workers sample.

    ``sources`` is the prepared split's ``sources`` directory (its sentences' bytes and
    ends); the targets keep the one segmentation the model is scored and decodes in.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        sources: str,
        plain: EncodedPairs,
        dropout: float,
        seed: int,
        directory: str,
        processes: int,
        chunk_pairs: int = CHUNK_PAIRS,
    ):
        self.tokenizer, self.sources, self.plain = tokenizer, sources, plain
        self.dropout, self.seed, self.directory = dropout, seed, directory
        self.processes, self.chunk_pairs = processes, chunk_pairs
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._ahead: dict[int, concurrent.futures.Future] = {}
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        os.makedirs(directory, exist_ok=True)

    def path(self, epoch: int) -> str:
        return os.path.join(self.directory, f"{_EPOCH}{epoch}")

    def __call__(self, epoch: int) -> EncodedPairs:
        with self._lock:
            ahead = self._ahead.pop(epoch, None)
        if ahead is not None:
            ahead.result()  # its error, if any, is raised here
        pairs = self._open(epoch)
        if pairs is None:
            self._build(epoch)
            pairs = self._open(epoch)
        if pairs is None:
            raise OSError(f"{self.path(epoch)} was removed while this process opened it")
        self._remove_before(epoch)
        self._start_ahead(epoch + 1)
        return pairs

    def close(self) -> None:
        """Stop sampling ahead and end the workers (an epoch being built is left partial)."""
        with self._lock:
            self._stopping.set()
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _open(self, epoch: int) -> EncodedPairs | None:
        """The pairs of a complete ``epoch`` (its ids mapped), or None where there is none
        (a damaged one is removed)."""
        path = self.path(epoch)
        if not os.path.isdir(path):
            return None
        try:
            src = np.load(f"{path}/src.npy", mmap_mode="r")
            offsets = np.load(f"{path}/src_offsets.npy", mmap_mode="r")
            whole = len(offsets) == len(self.plain) + 1 and offsets[-1] == len(src)
        except (OSError, ValueError, EOFError):
            whole = False
        if not whole:
            shutil.rmtree(path, ignore_errors=True)
            return None
        return dataclasses.replace(self.plain, src=src, src_offsets=offsets)

    def _start_ahead(self, epoch: int) -> None:
        with self._lock:
            if epoch in self._ahead or self._stopping.is_set() or os.path.isdir(self.path(epoch)):
                return
            future: concurrent.futures.Future = concurrent.futures.Future()
            self._ahead[epoch] = future

        def run() -> None:
            try:
                self._build(epoch)
                future.set_result(None)
            except BaseException as e:  # noqa: BLE001 - raised when the epoch is opened
                future.set_exception(e)

        threading.Thread(target=run, name=f"resample-{epoch}", daemon=True).start()

    def _remove_before(self, epoch: int) -> None:
        """Remove the files of the epochs before ``epoch`` (complete or partial)."""
        for name in os.listdir(self.directory):
            number = name[len(_EPOCH) :].split(".")[0]
            if name.startswith(_EPOCH) and number.isdigit() and int(number) < epoch:
                path = os.path.join(self.directory, name)
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(path)

    def _workers(self) -> concurrent.futures.ProcessPoolExecutor:
        with self._lock:
            if self._stopping.is_set():
                raise RuntimeError("resampling stopped")
            return self._pool or self._start_pool()

    def _start_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["__main__", __name__])  # imported once, not per worker
        args = (self.tokenizer.model_proto, os.getpid())
        self._pool = concurrent.futures.ProcessPoolExecutor(
            self.processes, context, _start_resampler, args
        )
        return self._pool

    def _build(self, epoch: int) -> None:
        """Write ``epoch`` unless it is complete (another process may be writing it: then
        wait for it), resuming from the whole chunks of an interrupted build."""
        path = self.path(epoch)
        with locked(f"{path}.lock"):
            if self._open(epoch) is not None:
                return
            partial = f"{path}.partial"
            os.makedirs(partial, exist_ok=True)
            starts = range(0, len(self.plain), self.chunk_pairs)
            chunks = [f"{partial}/chunk-{k:06d}.npz" for k in range(len(starts))]
            todo = [(k, a) for k, a in enumerate(starts) if not os.path.isfile(chunks[k])]
            dtype = token_dtype(self.tokenizer.vocab_size)
            try:
                self._sample(epoch, todo, chunks)
                self._workers().submit(_assemble, partial, chunks, dtype).result()
            except concurrent.futures.process.BrokenProcessPool as e:
                raise OSError(f"a process sampling BPE-dropout stopped ({e})") from None
            os.rename(partial, path)
            for chunk in chunks:  # after the rename: a complete epoch never lacks a chunk
                os.remove(os.path.join(path, os.path.basename(chunk)))

    def _sample(self, epoch: int, todo: list[tuple[int, int]], chunks: list[str]) -> None:
        """The chunks ``todo`` sampled by the workers, at most two per worker submitted at a
        time (so that an exiting process waits for few)."""
        pending: list[concurrent.futures.Future] = []
        for k, first in todo:
            stop = min(first + self.chunk_pairs, len(self.plain))
            seed = chunk_seed(self.seed, epoch, k)
            args = (self.sources, first, stop, self.dropout, seed, chunks[k])
            pending.append(self._workers().submit(_sample_chunk, *args))
            if len(pending) >= 2 * self.processes:
                pending.pop(0).result()
        for future in pending:
            future.result()
