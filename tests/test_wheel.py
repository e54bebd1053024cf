"""The package as a stranger installs it: a wheel built from the project's files, installed
into a fresh virtual environment outside the repository, trains the tiny run and translates
with the ``transformer-jax`` console script, from a folder that is not the clone."""

import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow

# The tiny config shortened: a few steps of small batches, a small tokenizer sample, a few
# sentences decoded at the end.
SHORT = [
    "--config.train.num_steps=4",
    "--config.train.checkpoint_every=4",
    "--config.train.log_every=2",
    "--config.train.eval_sentences=8",
    "--config.train.test_sentences=8",
    "--config.train.samples=1",
    "--config.data.tokens_per_batch=512",
    "--config.data.tokenizer_train_sentences=5000",
]


def run(command, cwd, env, stdin=None, timeout=300):
    return subprocess.run(
        command, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """(the venv's bin folder, an environment without PYTHONPATH): the wheel built from a
    copy of the project's files (a build writes build/ and *.egg-info next to them),
    installed with pip into a venv that reuses this interpreter's packages (no download)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "transformer_jax", source / "transformer_jax", ignore=ignore)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    options = ["--no-deps", "--no-index", "--no-build-isolation"]
    built = run([*pip, "wheel", *options, "--wheel-dir", str(tmp), str(source)], tmp, None)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = tmp.glob("transformer_jax-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv])
    python = str(venv / "bin" / "python")
    installed = run(
        [*pip, "--python", python, "install", "--no-deps", "--no-index", wheel], tmp, None
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return venv, env


def test_the_wheel_trains_and_translates_outside_the_clone(venv, tmp_path):
    venv, env = venv
    where = "import transformer_jax.configs as c; print(c.__file__); print(*c.NAMES)"
    found = run([str(venv / "bin" / "python"), "-c", where], tmp_path, env)
    module, names = found.stdout.splitlines()
    assert module.startswith(str(venv)), module  # the wheel's copy, not the clone's
    assert names.split() == ["base", "big", "multi30k", "tiny"]

    script = str(venv / "bin" / "transformer-jax")
    trained = run([script, "train", "--workdir", "run", *SHORT], tmp_path, env)  # tiny
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "step 4 test" in trained.stdout
    assert (tmp_path / "run" / "checkpoints" / "4").is_dir()
    source = "the brave shark worked\nthe pig trusted a map again\n"
    translated = run([script, "translate", "--workdir", "run", "--beam_size", "1"], tmp_path,
                     env, stdin=source)  # fmt: skip
    assert translated.returncode == 0, translated.stderr[-3000:]
    assert len(translated.stdout.splitlines()) == 2

    # a packaged config by name, with its get_config argument: multi30k's budgets
    named = run([script, "train", "--config", "multi30k:45", "--workdir", "m"], tmp_path, env)
    assert named.returncode == 1 and "BUDGET takes one of" in named.stderr, named.stderr
    assert not (tmp_path / "m").exists()
