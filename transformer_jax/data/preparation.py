"""A run's data prepared: its tokenizer and the prepared splits that training maps.

The tokenizer is trained once on the training split and saved as
``{workdir}/tokenizer.model``; each split is prepared once into
``{data.data_dir or workdir/data_cache}/{split}-{key}/`` (the format:
:mod:`transformer_jax.data.prepared`), keyed by the tokenizer and the data source, so a
restarted run neither retrains nor re-encodes. ``train.py`` calls :func:`prepare_data` on
process 0 before training; ``transformer-jax prepare`` calls :func:`prepare_run_data`.

The training split is read from its source once: into a spool (its sentences end to end,
mapped), from which the tokenizer's sample is drawn by index and which is encoded and then
removed. Splits are encoded ``CHUNK_PAIRS`` pairs at a time by ``data.prepare_workers``
processes (0: one per core), each chunk with one thread; the chunks are written in order,
so the files are the same bytes for any number of workers.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from tqdm import tqdm

from transformer_jax.data.batching import EncodedPairs
from transformer_jax.data.config import DataConfig
from transformer_jax.data.prepared import (
    CHUNK_PAIRS,
    DamagedSplit,
    chunked,
    open_sources,
    open_split,
    source_texts,
    token_dtype,
    write_sources,
    write_split,
)
from transformer_jax.data.sources import Pair, ReadCounts, count_pairs, stream_pairs, text_path
from transformer_jax.data.spool import open_spool, read_spool, texts_at, write_spool
from transformer_jax.data.tokenizer import (
    Tokenizer,
    load_tokenizer,
    order_by_frequency,
    sample_indices,
    train_tokenizer,
)

TOKENIZER_FILE = "tokenizer.model"
CACHE_DIR = "data_cache"
# A chunk: its pairs, or (spool, first pair, stop pair) for pairs a worker reads itself.
Chunk = list[Pair] | tuple[str, int, int]
worker_state: dict[str, Any] = {"spools": {}}  # a worker process's tokenizer and mapped spools


def get_tokenizer(
    data_config: DataConfig, workdir: str, vocab_size: int, target_vocab_size: int | None = None
) -> Tokenizer:
    """``{workdir}/tokenizer.model``, trained on both sides of the training split if absent.

    The split is first spooled (kept for its encoding); at most
    ``data.tokenizer_train_sentences`` of its sentences are used, chosen by
    ``sample_indices`` with ``data.seed``, in the corpus's order. The vocabulary may come
    out smaller than ``vocab_size`` on a small corpus (see ``Tokenizer.vocab_size``). With
    ``target_vocab_size`` below ``vocab_size`` its pieces are numbered by frequency on the
    target side and targets are encoded with the first ``target_vocab_size``.
    """
    path = os.path.join(workdir, TOKENIZER_FILE)
    if os.path.isfile(path):
        return load_tokenizer(path, target_vocab_size)
    spool = spool_path(data_config, data_config.train_split, workdir)
    if not os.path.isdir(spool):
        os.makedirs(os.path.dirname(spool), exist_ok=True)
        counts = ReadCounts()
        write_spool(stream_pairs(data_config, data_config.train_split, counts), spool, counts)
    texts = open_spool(spool, ReadCounts())
    limit, seed = data_config.tokenizer_train_sentences, data_config.seed
    sample = texts_at(texts, sample_indices(len(texts[1]), limit, seed))
    target_words = None
    if target_vocab_size is not None and target_vocab_size < vocab_size:
        target_words = _target_words(read_spool(spool, ReadCounts()))
    return train_tokenizer(
        sample, path, vocab_size, target_words=target_words, target_vocab_size=target_vocab_size
    )


def _target_words(pairs: Iterable[Pair]) -> Counter[str]:
    """How often each word of the targets of ``pairs`` (split at spaces) occurs."""
    words: Counter[str] = Counter()
    for _, target in pairs:
        words.update(target.split(" "))
    return words


def _origin(data_config: DataConfig, split: str) -> dict[str, Any]:
    """What the pairs of ``split`` come from (text files by size and modification time)."""
    fields = ("source", "tfds_name", "text_dir", "src_lang", "tgt_lang")
    origin = {name: getattr(data_config, name) for name in fields}
    origin.update(split=split)
    if data_config.source == "text":  # an edited file is encoded again
        langs = (data_config.src_lang, data_config.tgt_lang)
        stats = [os.stat(text_path(data_config.text_dir, split, lang)) for lang in langs]
        origin["files"] = [(stat.st_size, stat.st_mtime_ns) for stat in stats]
    return origin


def _key(origin: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(origin, sort_keys=True).encode()).hexdigest()[:16]


def cache_dir(data_config: DataConfig, workdir: str) -> str:
    """Where a run's spools and prepared splits are: ``data.data_dir`` or its data_cache/."""
    return data_config.data_dir or os.path.join(workdir, CACHE_DIR)


def spool_path(data_config: DataConfig, split: str, workdir: str) -> str:
    """Where the pairs of a split read to train the tokenizer are kept for encoding."""
    name = f"{split}-{_key(_origin(data_config, split))}.spool"
    return os.path.join(cache_dir(data_config, workdir), name)


def read_pairs(
    data_config: DataConfig, split: str, workdir: str, counts: ReadCounts
) -> Iterator[Pair]:
    """The pairs of ``split``: from its spool where there is one, else from the source."""
    spool = spool_path(data_config, split, workdir)
    if os.path.isdir(spool):
        return read_spool(spool, counts)
    return stream_pairs(data_config, split, counts)


def prepared_path(data_config: DataConfig, split: str, tokenizer: Tokenizer, workdir: str) -> str:
    """Where ``split`` is prepared: ``{data.data_dir or workdir/data_cache}/{split}-{key}``."""
    origin = _origin(data_config, split)
    origin.update(tokenizer=tokenizer.fingerprint)
    if tokenizer.target_vocab_size is not None:
        origin["target_vocab_size"] = tokenizer.target_vocab_size
    return os.path.join(cache_dir(data_config, workdir), f"{split}-{_key(origin)}")


def encode_pairs(tokenizer: Tokenizer, pairs: list[Pair], num_threads: int = -1) -> EncodedPairs:
    """The token ids of ``pairs`` (sentencepiece on ``num_threads`` threads; -1: all)."""
    src = tokenizer.encode_batch([s for s, _ in pairs], num_threads)
    tgt = tokenizer.encode_targets([t for _, t in pairs], num_threads)
    return EncodedPairs.from_lists(src, tgt)


def workers(data_config: DataConfig) -> int:
    """The processes that encode: ``data.prepare_workers``, or one per usable core."""
    return data_config.prepare_workers or len(os.sched_getaffinity(0))


def start_worker(model_proto: bytes, target_vocab_size: int | None, parent: int) -> None:
    """A worker process's start (preparation's and :mod:`.resampled`'s): its tokenizer in
    :data:`worker_state`, Ctrl-C left to the parent, and an end when ``parent`` ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    worker_state["tokenizer"] = Tokenizer(model_proto, target_vocab_size)
    threading.Thread(target=_end_with, args=(parent,), daemon=True).start()


def _end_with(parent: int) -> None:
    """End this worker process once the process ``parent`` has ended however it ended (a
    worker of a killed process would otherwise wait for work forever)."""
    while True:
        time.sleep(1)
        try:
            os.kill(parent, 0)
        except OSError:  # gone (or its number reused by another user's process)
            os._exit(1)


def _pairs_of(chunk: Chunk, spools: dict[str, Any]) -> list[Pair]:
    """The pairs of ``chunk``; a spool is mapped once into ``spools``."""
    if isinstance(chunk, list):
        return chunk
    spool, first, stop = chunk
    if spool not in spools:
        spools[spool] = open_spool(spool, ReadCounts())
    sentences = source_texts(spools[spool], 2 * first, 2 * stop)
    return list(zip(sentences[::2], sentences[1::2], strict=True))


def _encode_in_worker(chunk: Chunk) -> EncodedPairs:
    """``chunk`` encoded, its ids in the prepared split's dtype (half the bytes to send)."""
    tokenizer = worker_state["tokenizer"]
    encoded = encode_pairs(tokenizer, _pairs_of(chunk, worker_state["spools"]), num_threads=1)
    dtype = token_dtype(tokenizer.vocab_size)
    return dataclasses.replace(
        encoded, src=encoded.src.astype(dtype), tgt=encoded.tgt.astype(dtype)
    )


def encode_chunks(
    tokenizer: Tokenizer, chunks: Iterable[Chunk], processes: int
) -> Iterator[EncodedPairs]:
    """The encoded ``chunks``, in order: by ``processes`` worker processes (at most two
    chunks each ahead of the one awaited), or in this process for one process or chunk."""
    chunks = iter(chunks)
    first = list(itertools.islice(chunks, 2))
    if processes == 1 or len(first) < 2:
        spools: dict[str, Any] = {}
        for chunk in itertools.chain(first, chunks):
            yield encode_pairs(tokenizer, _pairs_of(chunk, spools), num_threads=processes)
        return
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["__main__", __name__])  # imported once, not per worker
    args = (tokenizer.model_proto, tokenizer.target_vocab_size, os.getpid())
    pool = concurrent.futures.ProcessPoolExecutor(processes, context, start_worker, args)
    pending: collections.deque = collections.deque()
    try:
        for chunk in itertools.chain(first, chunks):
            pending.append(pool.submit(_encode_in_worker, chunk))
            if len(pending) > 2 * processes:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except concurrent.futures.process.BrokenProcessPool as e:
        raise OSError(f"a process encoding the data stopped ({e}); rerun to resume") from None
    finally:
        pool.shutdown(cancel_futures=True)


def _check_target_order(data_config: DataConfig, tokenizer: Tokenizer, workdir: str) -> None:
    """ValueError unless the tokenizer numbers its pieces for the target words of the
    training split (read before anything is written)."""
    words = _target_words(read_pairs(data_config, data_config.train_split, workdir, ReadCounts()))
    if order_by_frequency(tokenizer.model_proto, words) != tokenizer.model_proto:
        raise ValueError(
            f"{os.path.join(workdir, TOKENIZER_FILE)} does not number its pieces for the "
            f"targets of {data_config.train_split!r}, so "
            f"model.tgt_vocab_size={tokenizer.target_vocab_size} would keep other pieces than "
            "the most frequent: train with another --workdir (or without model.tgt_vocab_size)"
        )


def _chunks_of(
    data_config: DataConfig, split: str, workdir: str, counts: ReadCounts, chunk_pairs: int
) -> tuple[Callable[[int], Iterable[Chunk]], int | None]:
    """``chunks(done)``: the chunks of ``split`` after the first ``done`` (of its spool, or
    read from its source), filling ``counts``; and the lines they come from (or None)."""
    spool = spool_path(data_config, split, workdir)
    if os.path.isdir(spool):
        pairs = len(open_spool(spool, counts)[1]) // 2

        def spooled(done: int) -> list[Chunk]:
            starts = range(done * chunk_pairs, pairs, chunk_pairs)
            return [(spool, a, min(a + chunk_pairs, pairs)) for a in starts]

        return spooled, pairs + counts.skipped_empty

    def streamed(done: int) -> Iterator[Chunk]:
        pairs = stream_pairs(data_config, split, counts)
        return itertools.islice(chunked(pairs, chunk_pairs), done, None)

    return streamed, count_pairs(data_config, split)


def prepare_split(
    data_config: DataConfig,
    split: str,
    tokenizer: Tokenizer,
    workdir: str,
    chunk_pairs: int = CHUNK_PAIRS,
    rebuild: bool = False,
) -> str:
    """Prepare ``split`` unless it is; its directory. A damaged prepared split is a
    :class:`DamagedSplit` naming the file and the command that rebuilds it, or with
    ``rebuild`` is prepared anew (a warning line names the file)."""
    path = prepared_path(data_config, split, tokenizer, workdir)
    if os.path.isdir(path):
        try:
            open_split(path)
            return path
        except DamagedSplit as e:
            if not rebuild:
                hint = f"rebuild it with: transformer-jax prepare --workdir {workdir}"
                raise DamagedSplit(
                    e.file, e.reason, f"{hint} and this run's --config and overrides"
                ) from None
            print(f"warning: {e}; preparing {os.path.basename(path)} anew", file=sys.stderr)
            shutil.rmtree(path)
    if split == data_config.train_split and tokenizer.target_vocab_size is not None:
        _check_target_order(data_config, tokenizer, workdir)
    counts = ReadCounts()
    chunks, total = _chunks_of(data_config, split, workdir, counts, chunk_pairs)
    bar = tqdm(total=total, desc=f"preparing {split}", unit=" pairs", mininterval=1)

    def encoded(done: int) -> Iterator[EncodedPairs]:
        pairs = done * chunk_pairs
        for chunk in encode_chunks(tokenizer, chunks(done), workers(data_config)):
            pairs += len(chunk)
            bar.update(pairs + counts.skipped_empty - bar.n)  # the lines read
            yield chunk

    with bar:
        info = write_split(path, encoded, counts, tokenizer.vocab_size, chunk_pairs=chunk_pairs)
    shutil.rmtree(spool_path(data_config, split, workdir), ignore_errors=True)
    print(
        f"{split}: {info['pairs']} pairs prepared in {path} ({info['skipped_empty']} skipped "
        f"for an empty side, {info['replaced_lines']} lines with undecodable bytes replaced "
        "by U+FFFD)"
    )
    return path


def prepared_sources(
    data_config: DataConfig, tokenizer: Tokenizer, workdir: str
) -> tuple[np.ndarray, np.ndarray]:
    """The source sentences of the prepared training split (for BPE-dropout), memory-mapped;
    written into it first if absent."""
    split = data_config.train_split
    path = prepare_split(data_config, split, tokenizer, workdir)
    if open_sources(path) is None:
        write_sources(path, read_pairs(data_config, split, workdir, ReadCounts()))
    sources = open_sources(path)
    pairs = open_split(path)[1]["pairs"]
    if sources is None or len(sources[1]) != pairs:
        found = "none" if sources is None else len(sources[1])
        raise ValueError(
            f"{path}/sources holds {found} sentences for {pairs} pairs: delete that directory "
            "to write it anew"
        )
    return sources


def run_splits(data_config: DataConfig, final_test: bool) -> list[str]:
    """The splits a run reads: training, dev, and test when ``train.final_test``."""
    test = [data_config.test_split] if final_test else []
    return [data_config.train_split, data_config.eval_split, *test]


def prepare_data(
    data_config: DataConfig,
    workdir: str,
    tokenizer: Tokenizer,
    splits: list[str],
    rebuild: bool = False,
) -> None:
    """Prepare each of ``splits`` that is not prepared yet (with the training sources when
    ``data.bpe_dropout`` resamples them); with ``rebuild``, the damaged ones anew."""
    for split in dict.fromkeys(splits):
        prepare_split(data_config, split, tokenizer, workdir, rebuild=rebuild)
    if data_config.bpe_dropout and data_config.train_split in splits:
        prepared_sources(data_config, tokenizer, workdir)


def prepare_run_data(
    data_config: DataConfig,
    workdir: str,
    vocab_size: int,
    target_vocab_size: int | None,
    splits: list[str],
) -> list[str]:
    """``transformer-jax prepare``: the tokenizer (``vocab_size`` pieces, targets from the
    first ``target_vocab_size``) and each of ``splits``, a damaged one prepared anew; their
    directories."""
    os.makedirs(workdir, exist_ok=True)
    tokenizer = get_tokenizer(data_config, workdir, vocab_size, target_vocab_size)
    prepare_data(data_config, workdir, tokenizer, splits, rebuild=True)
    return [prepared_path(data_config, split, tokenizer, workdir) for split in splits]
