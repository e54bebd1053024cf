"""One command-line convention (cli/flags.py): every command's failure of each kind exits with
the same code and one line; ``--help`` lists the command's own flags; ``train`` names its
workdir at start and end (process 0 only) and leaves ``sys.unraisablehook`` as it found it."""

import os
import signal
import sys

import jax
import pytest
from conftest import ROOT

from transformer_jax import kernels
from transformer_jax.cli import flags as cli_flags
from transformer_jax.cli import train as train_cli
from transformer_jax.cli.main import COMMANDS
from transformer_jax.cli.main import command as command_module
from transformer_jax.training import logs, loop

MISSING = "/no/such/path"
# failure kind -> (exit code, {command: its command line with that failure})
FAILURES = {
    "unknown flag": (2, {name: ["--bogus=1"] for name in COMMANDS}),
    "value the flag refuses": (
        2,
        {
            "train": ["--peer_timeout=soon"],
            "translate": ["--workdir=w", "--beam_size=four"],
            "evaluate": ["--workdir=w", "--src=a", "--ref=b", "--batch_size=0"],
            "average": ["--workdir=w", "--last=five"],
            "download": ["multi30k", "--dest=d", "--langs=en,xx"],
            "prepare": ["--config.train.num_steps=many"],
            "plan": ["--gpu=v100"],
        },
    ),
    "required flag missing": (
        2,
        {
            "translate": ["--beam_size=1"],
            "evaluate": ["--workdir=w", "--src=a"],
            "average": ["--last=2"],
            "download": ["multi30k"],
        },
    ),
    "unknown config field": (
        2,
        {name: ["--config.trian.num_steps=1"] for name in ("train", "prepare", "plan")},
    ),
    "extra argument": (
        2,
        {
            "train": ["extra"],
            "translate": ["--workdir=w", "extra"],
            "evaluate": ["--workdir=w", "--src=a", "--ref=b", "extra"],
            "average": ["--workdir=w", "extra"],
            "download": ["multi30k", "extra", "--dest=d"],
            "prepare": ["extra"],
            "plan": ["extra"],
        },
    ),
    "missing file": (
        1,
        {
            "train": [f"--config={MISSING}.py"],
            "translate": [f"--workdir={MISSING}"],
            "evaluate": [f"--workdir={MISSING}", f"--src={MISSING}", f"--ref={MISSING}"],
            "average": [f"--workdir={MISSING}"],
            "download": ["multi30k", "--dest=d", f"--base_url=file://{MISSING}"],
            "prepare": [f"--config={MISSING}.py"],
            "plan": [f"--config={MISSING}.py"],
        },
    ),
    "bad config value": (
        1,
        {
            name: ["--config", "multi30k:45"]  # get_config refuses the argument
            for name in ("train", "prepare", "plan")
        },
    ),
}
CASES = [
    pytest.param(kind, code, command, argv, id=f"{command}-{kind}")
    for kind, (code, argvs) in FAILURES.items()
    for command, argv in argvs.items()
]


@pytest.fixture
def keep_sigterm():
    """train's main sets SIGTERM's handler for its start-up: restored for the test session."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("kind, code, command, argv", CASES)
def test_each_failure_kind_has_one_exit_code_in_every_command(
    kind, code, command, argv, tmp_path, monkeypatch, capsys, keep_sigterm
):
    monkeypatch.chdir(tmp_path)  # a command that got past the failure writes only here
    assert command_module(command).main(argv) == code
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("error: ") and "Traceback" not in line, line
    assert captured.out == "" and not [f for *_, files in os.walk(tmp_path) for f in files]


def test_every_command_has_a_case_of_every_kind_it_can_fail_by():
    commands = {command for _, (_, argvs) in FAILURES.items() for command in argvs}
    assert commands == set(COMMANDS)
    for kind in ("unknown flag", "value the flag refuses", "extra argument"):
        assert set(FAILURES[kind][1]) == set(COMMANDS), kind


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_lists_the_commands_own_flags_only(command, capsys, keep_sigterm):
    assert command_module(command).main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(command_module(command).__doc__.rstrip().splitlines()[0])
    assert "--flagfile" not in out and "--undefok" not in out and "--verbosity" not in out
    assert ("--multihost" in out) == (command == "train")
    assert ("--config:" in out) == (command in ("train", "prepare", "plan"))


def test_a_command_twice_in_one_process_keeps_nothing_of_the_first(capsys):
    """Flags live in a new FlagValues per call: a value given once is not given again."""
    average = command_module("average").main
    assert average([f"--workdir={MISSING}", "--last=3"]) == 1
    assert average(["--last=3"]) == 2  # --workdir is required again
    assert capsys.readouterr().err.splitlines()[-1] == "error: --workdir is required"


@pytest.fixture
def fake_training(monkeypatch):
    """train's main up to train_and_evaluate, which returns ``result`` and records the
    unraisable hook it ran under; no process settings changed."""
    seen = {}

    def train_and_evaluate(config, workdir, **kwargs):
        seen["hook"], seen["workdir"] = sys.unraisablehook, workdir
        return seen["result"]

    monkeypatch.setattr(kernels, "configure_process", lambda platform: False)
    monkeypatch.setattr(loop, "train_and_evaluate", train_and_evaluate)
    return seen


@pytest.mark.parametrize(
    "result, code",
    [({"complete": True, "step": 4}, 0), ({"complete": False, "stopped_by": "SIGTERM"}, 75)],
)
def test_train_names_its_workdir_at_start_and_end_and_restores_the_hook(
    fake_training, tmp_path, capsys, keep_sigterm, result, code
):
    fake_training["result"] = result
    hook = sys.unraisablehook
    assert train_cli.main([f"--workdir={tmp_path / 'run'}"]) == code
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"workdir: {tmp_path / 'run'}",
        f"workdir: {tmp_path / 'run'} (checkpoints, config.json, metrics.jsonl)",
    ]
    assert fake_training["hook"] is not hook and sys.unraisablehook is hook


def test_train_names_its_workdir_on_process_zero_only(
    fake_training, tmp_path, capsys, monkeypatch, keep_sigterm
):
    fake_training["result"] = {"complete": True, "step": 4}
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    assert train_cli.main([f"--workdir={tmp_path}"]) == 0
    assert capsys.readouterr().out == ""


def test_quiet_orbax_drops_a_closed_loop_only_while_entered(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    hook = sys.unraisablehook

    class Unraisable:
        exc_type = RuntimeError

        def __init__(self, message):
            self.exc_value = RuntimeError(message)

    with train_cli.quiet_orbax():
        sys.unraisablehook(closed := Unraisable("Event loop is closed"))
        sys.unraisablehook(other := Unraisable("another error"))
    assert seen == [other] and sys.unraisablehook is hook
    sys.unraisablehook(closed)
    assert seen == [other, closed]


@pytest.mark.parametrize("process, printed", [(0, "evaluation\n"), (1, "")])
def test_only_process_zero_says(process, printed, monkeypatch, capsys):
    monkeypatch.setattr(jax, "process_index", lambda: process)
    logs.say("evaluation")
    assert capsys.readouterr().out == printed


def test_the_readme_has_one_row_per_exit_code():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    codes = {
        cli_flags.EXIT_OK: "done",
        cli_flags.EXIT_ERROR: "error",
        cli_flags.EXIT_USAGE: "command line",
        cli_flags.EXIT_PREEMPTED: "SIGTERM",
        cli_flags.EXIT_INTERRUPTED: "Ctrl-C",
    }
    rows = [line for line in text.splitlines() if line.startswith("| ") and "|" in line[2:]]
    for code, word in codes.items():
        assert any(row.startswith(f"| {code} ") and word in row for row in rows), (code, rows)
