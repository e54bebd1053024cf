"""The commands' persistent compilation cache: its folder, the flags that move it or turn it
off, one line for a folder that cannot be made, and a second start of the same run that loads
what the first compiled."""

import os
import resource
import subprocess
import sys

import jax
import pytest
from conftest import ROOT

from transformer_jax.cli.translate import main as translate_main
from transformer_jax.compilation_cache import default_directory, use_compilation_cache
from transformer_jax.data.synthetic import synthetic_pairs

SETTINGS = (
    "jax_enable_compilation_cache",
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
)


@pytest.fixture
def jax_settings():
    """The session's cache settings, restored after the test."""
    saved = {name: getattr(jax.config, name) for name in SETTINGS}
    yield
    use_compilation_cache(saved["jax_compilation_cache_dir"], saved["jax_enable_compilation_cache"])
    jax.config.update(SETTINGS[2], saved[SETTINGS[2]])


def test_the_folder_is_jaxs_variable_else_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_directory() == str(tmp_path / "xdg" / "transformer_jax" / "xla")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_directory() == str(tmp_path / "home" / ".cache" / "transformer_jax" / "xla")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert default_directory() == str(tmp_path / "jax")


def test_the_cache_keeps_every_program_or_none(monkeypatch, tmp_path, jax_settings):
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    folder = tmp_path / "cache"
    assert use_compilation_cache(str(folder)) == str(folder) and folder.is_dir()
    assert jax.config.jax_compilation_cache_dir == str(folder)
    assert jax.config.jax_enable_compilation_cache
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    jax.jit(lambda x: x * 3 + 1)(jax.numpy.arange(5)).block_until_ready()
    assert any(name.endswith("-cache") for name in os.listdir(folder))
    assert use_compilation_cache(str(tmp_path / "other"), enabled=False) is None
    assert not jax.config.jax_enable_compilation_cache and not (tmp_path / "other").exists()


def test_a_folder_that_cannot_be_made_is_one_line(tmp_path, capsys, jax_settings):
    (tmp_path / "file").write_text("")
    argv = ["--workdir", str(tmp_path), "--input", str(tmp_path / "file")]
    assert translate_main([*argv, f"--compilation_cache_dir={tmp_path / 'file' / 'xla'}"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: --compilation_cache_dir ") and "--nocompilation_cache" in line


def cpu_seconds_of(argv: list[str], env: dict[str, str]) -> float:
    """The CPU time (user + system) of the command ``argv`` run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


@pytest.mark.slow  # two train.py starts (about 25 CPU-s)
def test_a_second_start_of_the_same_run_loads_its_programs(tmp_path):
    """The tiny config on a small text corpus (so that compiling dominates the first start),
    trained one step and evaluated, twice in new workdirs: the second start compiles nothing
    new and spends at most half the first one's CPU time."""
    for split, size in (("train", 2000), ("validation", 16)):
        pairs = synthetic_pairs(split)[:size]
        for side, lang in ((0, "en"), (1, "lantic")):
            (tmp_path / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in pairs))
    cache = tmp_path / "xla"
    # XLA's optimisation at its default level, as a run compiles it (conftest lowers it)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    argv = [sys.executable, "train.py", "--config", "tiny", f"--compilation_cache_dir={cache}"]
    argv += ["--config.data.source=text", f"--config.data.text_dir={tmp_path}"]
    argv += ["--config.model.vocab_size=300", "--config.train.num_steps=1"]
    argv += ["--config.train.eval_sentences=4", "--config.train.final_test=false"]
    first = cpu_seconds_of([*argv, f"--workdir={tmp_path / 'first'}"], env)
    entries = sorted(os.listdir(cache))
    second = cpu_seconds_of([*argv, f"--workdir={tmp_path / 'second'}"], env)
    assert sorted(os.listdir(cache)) == entries
    assert second <= first / 2, f"first start {first:.1f} CPU-s, second {second:.1f}"
