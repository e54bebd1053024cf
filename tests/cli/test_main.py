"""The ``transformer-jax`` console script: each command reached by name with its own command
line, its ``--help`` keeping the description's layout, and packaged configs by name."""

import os
import resource
import subprocess
import sys

import pytest
from conftest import ROOT

from transformer_jax import configs
from transformer_jax.cli.main import COMMANDS, command, main


def test_usage_lists_every_command_and_a_wrong_one_exits_2(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in COMMANDS)
    assert main([]) == 2 and "usage: transformer-jax COMMAND" in capsys.readouterr().err
    assert main(["trian"]) == 2 and "unknown command 'trian'" in capsys.readouterr().err


def test_a_command_gets_the_rest_of_the_command_line_and_its_status_is_returned(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(sys, "argv", ["transformer-jax", "--last", "x"])  # not read
    assert main(["average", "--workdir", str(tmp_path / "none"), "--last", "2"]) == 1
    assert "error: workdir" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(set(COMMANDS) - {"train"}))
def test_help_keeps_the_descriptions_layout(name):
    """Each line of the command's docstring is a line of its ``--help`` (indented usage
    lines, lists and paragraphs as written), not a paragraph argparse rewrapped; each
    command in its own process, as the console script runs it (absl's flags are global)."""
    result = transformer_jax(name, "--help")
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    doc = command(name).__doc__
    missing = [line for line in doc.strip().splitlines() if line.rstrip() not in out]
    assert not missing, missing


def transformer_jax(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "transformer_jax.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=str(cwd),
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=120,
    )


def test_train_help_keeps_its_layout_and_names_the_packaged_configs():
    result = transformer_jax("train", "--help")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout.splitlines()
    assert "    python train.py --config base --workdir runs/base" in out
    assert f"a name ({', '.join(configs.NAMES)})" in result.stdout


def test_config_names_are_the_packaged_files_and_paths_pass_through(tmp_path, monkeypatch):
    here = os.path.dirname(configs.__file__)
    assert configs.NAMES == ("base", "big", "multi30k", "tiny")
    assert configs.config_file("base") == os.path.join(here, "base.py")
    assert configs.config_file("multi30k:60x2") == os.path.join(here, "multi30k.py") + ":60x2"
    for path in ("configs/base.py", "configs/multi30k.py:60", "mine.py", "nobase"):
        assert configs.config_file(path) == path
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base").write_text("def get_config(): ...\n")  # a file named like a config
    assert configs.config_file("base") == "base"


def test_train_loads_a_packaged_config_by_name_outside_the_clone(tmp_path):
    """``--config base`` from another folder: the paper's base model (d_model 512), here
    refused by validation before anything is written."""
    args = ["--config", "base", "--config.model.num_heads=7", "--workdir", "run"]
    result = transformer_jax("train", *args, cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "d_model=512 must be divisible by num_heads=7" in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


# Run as the console script runs it, then the heavy libraries that were imported.
HEAVY = ("jax", "flax", "tensorflow", "orbax", "optax")
IMPORTED = f"""
import sys
from transformer_jax.cli.main import main
try:
    status = main(sys.argv[1:])
finally:
    print(*sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)
sys.exit(status)
"""
# Every command line parsed, and a run config loaded and its fields checked, before any heavy
# import: the usage, each command's --help, a rejected flag or config field, a config value
# its field's check refuses (exit 1). Each runs with the working directory a fresh folder.
LIGHT = [
    ["--help"],
    ["trian"],
    *([name, "--help"] for name in COMMANDS),
    *([name, "--bogus=1"] for name in COMMANDS),
    ["train", "--config.train.bogus=1"],
    ["prepare", "--config", "base", "--config.model.bogus=1"],
    ["plan", "--config.data.bogus=1"],
    ["evaluate", "--workdir=run", "--src=a", "--ref=b", "--beam_size=0"],
]
REFUSED_VALUES = [  # a field's check refuses it: exit 1, the field named
    ["train", "--config.data.max_len=0"],
    ["train", "--config", "base", "--config.model.positional=rotary"],
    ["prepare", "--config.data.source=csv"],
    ["plan", "--config.train.parallel=dp"],
    ["train", "--config.decode.beam_size=0"],
]


@pytest.mark.parametrize("argv", LIGHT + REFUSED_VALUES, ids=" ".join)
def test_usage_help_and_flag_errors_import_no_jax(argv, tmp_path, record_property):
    """Each in a fresh process, its CPU seconds recorded (``--junitxml``: property ``cpu_s``)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(
        [sys.executable, "-c", IMPORTED, *argv],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        cwd=tmp_path,
        timeout=120,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    record_property("cpu_s", round(cpu, 3))
    *said, heavy = result.stderr.splitlines() or [""]
    assert heavy == "", f"{argv} imported {heavy}"
    code = 0 if "--help" in argv else 1 if argv in REFUSED_VALUES else 2
    assert result.returncode == code, result.stderr
    if "--help" not in argv and argv != ["trian"]:  # a flag or config error: one line
        assert len(said) == 1 and said[0].startswith("error: "), said
    if argv in REFUSED_VALUES:
        field = argv[-1].removeprefix("--config.").partition("=")[0]
        assert said[0].startswith(f"error: {field} must be "), said
    assert not list(tmp_path.iterdir()), "nothing is written before the command runs"
