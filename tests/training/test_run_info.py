"""``{workdir}/run_info.json``: the facts a started run prints, in a file tools read."""

import dataclasses
import json
import os
import sys

import jax
import pytest
from conftest import ROOT

from transformer_jax.data.batching import Batcher, EncodedPairs, TrainIterator
from transformer_jax.kernels import cpuinfo
from transformer_jax.training.logs import (
    RUN_INFO_FILE,
    describe_run_info,
    read_run_info,
    run_info,
    write_run_info,
)
from transformer_jax.training.loop import train_and_evaluate
from transformer_jax.training.schema import RunConfig


def _config(steps: int):
    sys.path.insert(0, str(ROOT))
    from configs.tiny import get_config

    config = get_config()
    config.model.update(
        vocab_size=300, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1
    )
    config.data.update(tokens_per_batch=256, tokenizer_train_sentences=2000)
    config.train.update(num_steps=steps, warmup_steps=2, eval_sentences=0, final_test=False)
    return config


def test_run_info_counts_pairs_batches_and_tokens_with_their_eos():
    sources = [[5, 6], [7], [5, 6, 7, 8, 9, 10]]  # the third is longer than max_len=4
    targets = [[8, 9, 10], [11, 12], [5]]
    pairs = EncodedPairs.from_lists(sources, targets)
    read = {"skipped_empty": 2, "replaced_lines": 1}  # what a prepared split's reading counted
    pairs = dataclasses.replace(pairs, read_counts=read)
    batcher = Batcher(pairs, tokens_per_batch=8, max_len=4)
    config = _config(steps=1)
    config.data.max_len = 4
    info = run_info(RunConfig.from_config(config), 300, TrainIterator(batcher), "float32")
    assert info["train_pairs"] == 2 and info["dropped_too_long"] == 1 and info["max_len"] == 4
    assert info["source_tokens_per_epoch"] == (2 + 1) + (1 + 1)
    assert info["target_tokens_per_epoch"] == (3 + 1) + (2 + 1)
    assert info["batches_per_epoch"] == 1 and info["vocab_size"] == 300
    assert info["devices"] >= 1 and info["processes"] == 1 and info["parallel"] == "pmap"
    assert info["skipped_empty"] == 2 and info["replaced_lines"] == 1
    assert info["matmul_precision"] == "float32"
    assert describe_run_info(info).startswith(
        "2 training pairs (1 longer than data.max_len=4 dropped), 1 batches per epoch; "
        "vocabulary 300; "
    )
    packed = run_info(
        config,
        300,
        TrainIterator(Batcher(pairs, tokens_per_batch=8, max_len=4, packing=True)),
        "float32",
    )
    assert packed["batches_per_epoch"] is None  # packed batches are planned as they are read
    assert ", packed batches per epoch; " in describe_run_info(packed)


def test_run_info_round_trip_and_missing_file(tmp_path):
    info = {"train_pairs": 3, "parallel": "pmap"}
    write_run_info(str(tmp_path), info)
    assert read_run_info(str(tmp_path)) == info
    assert os.listdir(tmp_path) == [RUN_INFO_FILE]  # the temporary file was renamed
    with pytest.raises(ValueError, match=f"{tmp_path / 'absent' / RUN_INFO_FILE}"):
        read_run_info(str(tmp_path / "absent"))


@pytest.fixture
def compilation_cache(tmp_path):
    """A persistent XLA cache: the resumed run reuses the first run's compiled steps."""
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    previous = [getattr(jax.config, name) for name in names]
    jax.config.update(names[0], str(tmp_path / "xla_cache"))
    jax.config.update(names[1], 0)
    yield
    for name, value in zip(names, previous, strict=True):
        jax.config.update(name, value)


def test_the_loop_writes_what_it_prints_and_a_resume_keeps_it(
    tmp_path, capsys, compilation_cache, monkeypatch
):
    """... and the products' arithmetic that ``model.matmul_precision='auto'`` chose at the
    start (float32 on a CPU without bfloat16 instructions), config.json keeping 'auto'."""
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setattr(cpuinfo, "cpu_flags", lambda path=cpuinfo.CPUINFO: frozenset({"avx2"}))
    workdir = str(tmp_path / "run")
    config = _config(steps=1)
    config.model.matmul_precision = "auto"
    assert train_and_evaluate(RunConfig.from_config(config), workdir)["complete"]
    info = read_run_info(workdir)
    assert info["matmul_precision"] == "float32"
    with open(os.path.join(workdir, "config.json")) as f:
        assert json.load(f)["model"]["matmul_precision"] == "auto"
    assert describe_run_info(info) in capsys.readouterr().out
    assert info["train_pairs"] > 0 and info["batches_per_epoch"] is None  # tiny packs
    assert info["target_tokens_per_epoch"] > info["train_pairs"]  # at least one piece + EOS
    assert 0 < info["vocab_size"] <= 300
    config.train.num_steps = 2
    assert train_and_evaluate(RunConfig.from_config(config), workdir)["step"] == 2  # resumed
    assert read_run_info(workdir) == info
