"""A run's data prepared by ``transformer-jax prepare`` (the command in this process): the
tokenizer and each split, a bad config refused before anything is written, ``--workers``,
and a damaged split prepared anew alone."""

import os

from conftest import flip_a_bit

from transformer_jax.cli.prepare import main as prepare_main
from transformer_jax.configs.tiny import get_config as tiny_config
from transformer_jax.data import prepared
from transformer_jax.data.preparation import prepare_run_data


def test_prepare_run_data_writes_the_tokenizer_and_each_split(tmp_path):
    config = tiny_config()
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
