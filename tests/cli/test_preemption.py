"""A SIGTERM at any point of the train command's start-up exits 75 (preempted), and the
workdir it leaves resumes: ``python -m transformer_jax.train`` and ``transformer-jax train``
install the handler as the package starts loading (``transformer_jax/preemption.py``)."""

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from transformer_jax.preemption import runs_training

MICRO = [  # the tiny config, three steps, its tokenizer trained on few sentences
    "--config.model.vocab_size=300",
    "--config.data.tokenizer_train_sentences=2000",
    "--config.train.num_steps=3",
    "--config.train.eval_sentences=0",
    "--config.train.final_test=False",
]


@pytest.mark.parametrize(
    "argv, training",
    [
        (["python", "-m", "transformer_jax.train", "--config", "tiny"], True),
        (["python", "-X", "dev", "-m", "transformer_jax.train"], True),
        (["python", "/venv/bin/transformer-jax", "train", "--workdir", "w"], True),
        (["python", "-m", "transformer_jax.translate", "-m", "transformer_jax.train"], False),
        (["python", "/venv/bin/transformer-jax", "translate"], False),
        (["python", "script.py", "-m", "transformer_jax.train"], False),
        (["python", "-c", "import transformer_jax"], False),
    ],
)
def test_the_train_command_is_recognised_from_the_interpreters_command_line(argv, training):
    assert runs_training(argv) is training


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
