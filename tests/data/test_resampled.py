"""BPE-dropout's epochs sampled ahead into mapped files: the ids of a synchronous re-encode
(each chunk with its seed of ``(seed, epoch, k)``) for one or two workers, the same batches
as with that re-encode, resumes from a complete or partial epoch, old epochs removed, one
copy shared (memory-mapped) by the processes of a host."""

import dataclasses
import os
import random
import threading

import numpy as np
import pytest

from transformer_jax.data import pipeline, preparation, prepared, resampled
from transformer_jax.data.batching import Batcher, TrainIterator
from transformer_jax.data.config import DataConfig
from transformer_jax.data.resampled import ResampledEpochs

DROPOUT, SEED, CHUNK = 0.1, 4, 700
WORDS = "the a cat dog house tree runs sees big small red green Haus Katze Hund Baum".split()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A prepared training split of 2,000 pairs with its sources, and its tokenizer."""
    directory = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    with open(directory / "train.en", "w") as f, open(directory / "train.de", "w") as g:
        for _ in range(2000):
            f.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20))) + "\n")
            g.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20))) + "\n")
    config = DataConfig(
        source="text",
        text_dir=str(directory),
        tokens_per_batch=512,
        max_len=64,
        bpe_dropout=DROPOUT,
        seed=SEED,
    )
    workdir = str(directory / "run")
    tokenizer = preparation.get_tokenizer(config, workdir, 300)
    plain = pipeline.encoded_split(config, "train", tokenizer, workdir)
    path = preparation.prepared_path(config, "train", tokenizer, workdir)
    preparation.prepared_sources(config, tokenizer, workdir)
    return config, workdir, tokenizer, plain, os.path.join(path, prepared.SOURCES)


def epochs(run, directory, processes=1):
    _, _, tokenizer, plain, sources = run
    args = (tokenizer, sources, plain, DROPOUT, SEED, str(directory), processes, CHUNK)
    return ResampledEpochs(*args)


def reference(run, epoch):
    """The epoch re-encoded here, in order, chunk k of ``CHUNK`` sentences sampled with the
    draws of ``(SEED, epoch, k, STREAM)`` (the stream the module documents)."""
    _, _, tokenizer, plain, sources = run
    texts = prepared.source_texts(prepared.map_texts(sources), 0, len(plain))
    ids, lengths = [], []
    for k, first in enumerate(range(0, len(texts), CHUNK)):
        chunk = texts[first : first + CHUNK]
        found = tokenizer.encode_sampled(chunk, DROPOUT, [SEED, epoch, k, resampled.STREAM])
        ids.append(found[0].astype(plain.src.dtype))
        lengths.append(found[1])
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths))])
    return dataclasses.replace(plain, src=np.concatenate(ids), src_offsets=offsets)


def assert_same_sources(found, expected):
    np.testing.assert_array_equal(found.src_offsets, expected.src_offsets)
    np.testing.assert_array_equal(found.src, expected.src)


def test_one_and_two_workers_give_the_ids_of_a_synchronous_reencode(run, tmp_path):
    plain = run[3]
    expected = reference(run, 3)
    for processes in (1, 2):
        resampled = epochs(run, tmp_path / str(processes), processes)
        try:
            found = resampled(3)
        finally:
            resampled.close()
        assert_same_sources(found, expected)
        assert isinstance(found.src, np.memmap) and isinstance(found.src_offsets, np.memmap)
        assert found.src.dtype == plain.src.dtype and found.tgt is plain.tgt
        assert len(found.src) > len(plain.src)  # smaller pieces than the plain segmentation
    assert not np.array_equal(reference(run, 4).src, expected.src)


@pytest.mark.parametrize("packing", [False, True])
def test_iterator_batches_equal_those_of_a_synchronous_reencode(run, tmp_path, packing):
    plain = run[3]
    batcher = Batcher(plain, tokens_per_batch=512, max_len=64, packing=packing, num_shards=2)
    resampled = epochs(run, tmp_path, 2)
    try:
        ahead = TrainIterator(batcher, seed=SEED, resample=resampled)
        synchronous = TrainIterator(batcher, seed=SEED, resample=lambda e: reference(run, e))
        while ahead.get_state()["epoch"] < 2:  # across two epoch boundaries
            found, expected = next(ahead), next(synchronous)
            assert found.keys() == expected.keys()
            for key in found:
                np.testing.assert_array_equal(found[key], expected[key])
            assert ahead.get_state() == synchronous.get_state()
        assert isinstance(ahead.batcher.pairs.src, np.memmap)
        numbers = {int(name.split("-")[1].split(".")[0]) for name in os.listdir(tmp_path)}
        assert numbers <= {2, 3}  # epochs 0 and 1 removed; 3 sampled ahead
        assert os.path.isdir(resampled.path(2))
    finally:
        resampled.close()


def test_a_resumed_run_gets_the_ids_of_an_uninterrupted_one(run, tmp_path):
    uninterrupted = epochs(run, tmp_path / "whole")
    try:
        expected = uninterrupted(1)
    finally:
        uninterrupted.close()

    interrupted = epochs(run, tmp_path / "cut")  # killed with two chunks of epoch 1 written
    path = interrupted.path(1)
    chunks = [f"{path}.partial/chunk-{k:06d}.npz" for k in range(3)]
    os.makedirs(f"{path}.partial")
    try:
        interrupted._sample(1, [(0, 0), (2, 2 * CHUNK)], chunks)
    finally:
        interrupted.close()
    with open(f"{path}.partial/src.npy", "wb") as f:  # a torn assembly
        f.write(b"\x93NUMPY")

    resumed = epochs(run, tmp_path / "cut")
    sampled = []
    sample = resumed._sample
    resumed._sample = lambda epoch, todo, files: sampled.append(todo) or sample(epoch, todo, files)
    try:
        assert_same_sources(resumed(1), expected)
        assert sampled[0] == [(1, CHUNK)]  # the whole chunks were kept
        assert not os.path.exists(f"{path}.partial")
        with open(f"{path}/src.npy", "r+b") as f:  # a damaged complete epoch: sampled anew
            f.truncate(200)
    finally:
        resumed.close()
    again = epochs(run, tmp_path / "cut")
    try:
        assert_same_sources(again(1), expected)
    finally:
        again.close()


def test_the_processes_of_a_host_share_one_copy(run, tmp_path):
    """Two processes' resamplers (here threads) on one directory: one samples, both map it."""
    first, second = epochs(run, tmp_path), epochs(run, tmp_path)
    found = {}
    try:
        threads = [
            threading.Thread(target=lambda r=r, i=i: found.update({i: r(0)}))
            for i, r in enumerate((first, second))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        first.close()
        second.close()
    assert_same_sources(found[0], found[1])
    assert found[0].src.filename == found[1].src.filename == f"{first.path(0)}/src.npy"


def test_the_pipeline_resumes_a_bpe_dropout_run_exactly(run):
    config, workdir, tokenizer = run[:3]
    config = dataclasses.replace(config, packing=True, prepare_workers=2)
    whole = pipeline.train_iterator(config, workdir, tokenizer, num_shards=2)
    for _ in range(len(whole.batcher.kept) // 40):
        next(whole)
    state = whole.get_state()
    resumed = pipeline.train_iterator(config, workdir, tokenizer, num_shards=2, state=state)
    try:
        while whole.get_state()["epoch"] < state["epoch"] + 2:
            found, expected = next(resumed), next(whole)
            for key in found:
                np.testing.assert_array_equal(found[key], expected[key])
    finally:
        whole.resample.close()
        resumed.resample.close()
