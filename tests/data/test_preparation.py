"""A run's data prepared by ``transformer-jax prepare`` (the command in this process): the
tokenizer and each split, a bad config refused before anything is written, ``--workers``,
a damaged split prepared anew alone; and the worker processes ending with a killed parent."""

import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT, flip_a_bit

from transformer_jax.cli.prepare import main as prepare_main
from transformer_jax.configs.tiny import get_config as tiny_config
from transformer_jax.data import prepared
from transformer_jax.data.preparation import prepare_run_data
from transformer_jax.data.tokenizer import train_tokenizer
from transformer_jax.training.schema import RunConfig


def test_prepare_run_data_writes_the_tokenizer_and_each_split(tmp_path):
    config = RunConfig.from_config(tiny_config())
    workdir = str(tmp_path / "run")
    paths = prepare_run_data(config.data, workdir, 1000, None, ["train", "validation"])
    assert os.path.isfile(tmp_path / "run" / "tokenizer.model")
    assert [os.path.basename(p).split("-")[0] for p in paths] == ["train", "validation"]
    assert all(os.path.isdir(p) for p in paths)
    assert sorted(os.listdir(tmp_path / "run" / "data_cache")) == sorted(
        map(os.path.basename, paths)
    )


def test_the_command_refuses_a_bad_config_before_writing(tmp_path, capsys):
    workdir = str(tmp_path / "run")
    assert (
        prepare_main(["--config", "tiny", "--workdir", workdir, "--config.model.num_heads=7"]) == 1
    )
    assert "num_heads=7" in capsys.readouterr().err and not os.path.exists(workdir)
    assert prepare_main(["--config", "tiny", "--workdir", workdir, "--workers", "-1"]) == 1
    assert capsys.readouterr().err.startswith("error: data.prepare_workers")


def test_the_command_prepares_a_damaged_split_anew_and_nothing_else(tmp_path, capsys):
    workdir = str(tmp_path / "run")
    argv = ["--config", "tiny", "--workdir", workdir, "--config.train.final_test=False"]
    argv += ["--config.data.tokenizer_train_sentences=2000", "--workers", "2"]
    assert prepare_main(argv) == 0
    train, dev = capsys.readouterr().out.split("prepared:\n")[1].split()
    tokenizer = os.path.join(workdir, "tokenizer.model")
    kept = {p: os.stat(p).st_mtime_ns for p in (tokenizer, f"{dev}/src.npy", f"{dev}/tgt.npy")}
    flip_a_bit(train)
    assert prepare_main(argv) == 0
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if "damaged" in x]
    assert line.startswith(f"warning: prepared data damaged: {train}/") and "CRC-32" in line
    assert "preparing train" in err and "preparing validation" not in err
    assert kept == {p: os.stat(p).st_mtime_ns for p in kept}
    prepared.open_split(train)  # whole again


ENCODING = """
import sys
from transformer_jax.data import preparation
from transformer_jax.data.tokenizer import load_tokenizer

chunks = ([("the cat sees the dog " * 9, "die Katze " * 9)] * 2000 for _ in range(10_000))
for _ in preparation.encode_chunks(load_tokenizer(sys.argv[1]), chunks, 2):
    print("encoded", flush=True)
"""


def alive(pid):
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def descendants(pid):
    """The processes below ``pid`` (children, their children, ...), from /proc."""
    found, stack = [], [pid]
    while stack:
        parent = stack.pop()
        for task in os.listdir(f"/proc/{parent}/task"):
            with open(f"/proc/{parent}/task/{task}/children") as f:
                children = [int(child) for child in f.read().split()]
            found += children
            stack += children
    return found


@pytest.mark.slow  # a process of three killed (~10 s)
def test_the_workers_end_when_their_process_is_killed(tmp_path):
    words = "the cat sees a dog die Katze sieht einen Hund".split()
    lines = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 20
    train_tokenizer(lines, str(tmp_path / "tokenizer.model"), 300)
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    command = [sys.executable, "-c", ENCODING, str(tmp_path / "tokenizer.model")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    assert process.stdout.readline() == "encoded\n"  # the pool runs
    tree = descendants(process.pid)
    assert len(tree) >= 3  # the fork server and two workers
    process.kill()
    process.wait()
    deadline = time.monotonic() + 20
    while any(map(alive, tree)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(map(alive, tree))
