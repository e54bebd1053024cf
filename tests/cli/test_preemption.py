"""A SIGTERM at any point of the train command's start-up exits 75 (preempted), and the
workdir it leaves resumes: the train command installs the handler as it starts
(``transformer_jax/multihost/preemption.py``: ``train.py`` before its first import,
``cli.train.main`` first thing); importing the package installs none."""

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from transformer_jax.multihost.preemption import STOPPED_BEFORE_TRAINING

MICRO = [  # the tiny config, three steps, its tokenizer trained on few sentences
    "--config.model.vocab_size=300",
    "--config.data.tokenizer_train_sentences=2000",
    "--config.train.num_steps=3",
    "--config.train.eval_sentences=0",
    "--config.train.final_test=False",
]


PACKAGE = ROOT / "transformer_jax"
# Importing the package and every module of it: SIGTERM's handler stays the default one, and
# neither JAX nor Flax is imported by the package itself.
IMPORT_ALL = """
import importlib, pkgutil, signal, sys
import transformer_jax
heavy = sorted(m for m in ("jax", "flax", "tensorflow") if m in sys.modules)
for info in pkgutil.walk_packages(transformer_jax.__path__, "transformer_jax."):
    importlib.import_module(info.name)
print(heavy, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
"""


def test_importing_the_package_and_its_modules_installs_no_handler_nor_imports_jax():
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    command = [sys.executable, "-m", "transformer_jax.train", "--help"]  # must not matter
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["[]", "True"], result.stdout


def test_the_package_never_reads_the_interpreters_command_line():
    """What a module does on import cannot depend on how the interpreter was started."""
    readers = [
        str(path.relative_to(ROOT))
        for path in sorted(PACKAGE.rglob("*.py"))
        if "orig_argv" in path.read_text()
    ]
    assert not readers, readers


def sigterm_caught(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM (Linux: its SigCgt mask)."""
    with open(f"/proc/{pid}/status") as f:
        caught = next(line for line in f if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_sigterm_while_train_py_loads_exits_75_with_one_line(tmp_path):
    """Stopped while the libraries load (the handler is in place, nothing imported yet
    but the standard library): exit 75 and one line saying that nothing was saved."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    command = [sys.executable, str(ROOT / "train.py"), f"--workdir={tmp_path / 'run'}"]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 30
    while not sigterm_caught(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.001)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err[-2000:]
    assert err == f"error: {STOPPED_BEFORE_TRAINING}\n"
    assert "before training began" in err and "nothing was saved" in err
    assert out == "" and not (tmp_path / "run").exists()


def train(workdir, *extra):
    command = [sys.executable, "-m", "transformer_jax.train", f"--workdir={workdir}", *MICRO]
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    return subprocess.Popen(
        [*command, *extra], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )


@pytest.mark.slow
def test_sigterm_at_any_point_of_the_start_exits_75_and_the_workdir_resumes(tmp_path):
    workdir = tmp_path / "run"
    for delay in (0.5, 1, 2, 4, 8, 12):
        proc = train(workdir, "--config.train.num_steps=100000")  # still training at 12 s
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 75, (delay, err[-2000:])
        assert "Traceback" not in err, err
    proc = train(workdir)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
