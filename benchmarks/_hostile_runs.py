"""The processes of ``hostile_trials.py``: a tiny run's command lines, running them with a
timeout (and optional resource limits), and sorting what came out into an outcome.

Outcomes, best first: ``OK`` (did what it should), ``one-line error`` (refused with one
``error:`` line and a failure code), then the failures the trials exist to find:
``traceback`` (a Python traceback, a C++ abort or a death by signal), ``silent wrong``
(exit 0 with a wrong result or without a word about what it skipped), ``hang`` (ran past
the trial's timeout) and ``data loss`` (a checkpoint, config.json or metrics gone).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from _common import ROOT

OUTCOMES = ("OK", "one-line error", "traceback", "silent wrong", "hang", "data loss")
NOISE = ("Traceback", "Fatal Python error", "Check failure", "terminate called", "F1206")
STEPS = 8
MICRO = [  # the tiny config at a size that trains in seconds on two cores
    "--config=tiny",
    "--config.model.vocab_size=300",
    "--config.model.d_model=32",
    "--config.model.num_heads=2",
    "--config.model.d_ff=64",
    "--config.model.num_encoder_layers=1",
    "--config.model.num_decoder_layers=1",
    "--config.data.tokenizer_train_sentences=2000",
    "--config.data.tokens_per_batch=256",
    f"--config.train.num_steps={STEPS}",
    "--config.train.warmup_steps=10",
    "--config.train.log_every=1",
    "--config.train.checkpoint_every=2",
    "--config.train.keep_checkpoints=50",
    "--config.train.eval_sentences=0",
    "--config.train.final_test=False",
]


@dataclasses.dataclass
class Ran:
    """A finished (or killed) process: exit code (None: hung), its output, seconds."""

    code: int | None
    out: str
    seconds: float


RESUME_STEPS = 40  # the resumed runs': long enough that a signal lands before the end
# The resumed runs' references: the micro run as configured (packed batches) and on a data x
# model mesh over two simulated devices; each its ``--config`` overrides and environment.
VARIANTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "packed": ([f"--config.train.num_steps={RESUME_STEPS}"], {}),
    "mesh": (
        [
            f"--config.train.num_steps={RESUME_STEPS}",
            "--config.train.parallel=mesh",
            "--config.train.mesh_model=2",
        ],
        {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
    ),
}


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", **(extra or {}))


def reference(beside: str, variant: str, timeout: float) -> str:
    """The uninterrupted run of ``variant``, made once beside the reference ``beside``."""
    path = f"{beside}-{variant}"
    if not os.path.isfile(os.path.join(path, "metrics.jsonl")):
        extra, variables = VARIANTS[variant]
        ran = run(train_command(path, *extra), f"{path}.log", timeout, env_extra=variables)
        if ran.code != 0:
            raise RuntimeError(f"the {variant} reference run failed: {last_line(ran.out)}")
    return path


def train_command(workdir: str, *extra: str) -> list[str]:
    return [sys.executable, os.path.join(ROOT, "train.py"), f"--workdir={workdir}", *MICRO, *extra]


def module_command(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", f"transformer_jax.{module}", *args]


def start(
    command: Sequence[str],
    log: str,
    file_limit_kib: int = 0,
    env_extra: dict[str, str] | None = None,
) -> subprocess.Popen:
    """Start ``command``, its output to ``log``, ``env_extra`` added to its environment;
    ``file_limit_kib``: the largest file it may write (``ulimit -f``, a full disk: writes
    past it fail with EFBIG, SIGXFSZ ignored)."""
    if file_limit_kib:
        limited = f"trap '' XFSZ; ulimit -f {file_limit_kib}; exec \"$@\""
        command = ["bash", "-c", limited, "bash", *command]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            list(command),
            env=env(env_extra),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    proc.log = log  # type: ignore[attr-defined]
    proc.started = time.time()  # type: ignore[attr-defined]
    return proc


def wait(proc: subprocess.Popen, timeout: float) -> Ran:
    """Wait for ``proc`` at most ``timeout`` s from its start (then kill it: a hang)."""
    try:
        code = proc.wait(timeout=max(timeout - (time.time() - proc.started), 1))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    with open(proc.log, errors="replace") as f:
        return Ran(code, f.read(), time.time() - proc.started)


def run(
    command: Sequence[str],
    log: str,
    timeout: float,
    file_limit_kib: int = 0,
    env_extra: dict[str, str] | None = None,
) -> Ran:
    return wait(start(command, log, file_limit_kib, env_extra), timeout)


def wait_until(predicate: Callable[[], bool], procs: Sequence[subprocess.Popen], timeout: float):
    """Wait for ``predicate()``; False if a process ended or ``timeout`` passed first."""
    end = time.time() + timeout
    while not predicate():
        if time.time() > end or any(p.poll() is not None for p in procs):
            return False
        time.sleep(0.1)
    return True


def error_lines(out: str) -> list[str]:
    """The lines that name a problem (argparse's usage lines around its error do not)."""
    return [line for line in out.splitlines() if "error" in line.lower() or "unknown " in line]


def refused(ran: Ran, codes: Sequence[int] = (1, 2)) -> tuple[str, str]:
    """The outcome of a command that should refuse: one ``error:`` line and a failure code."""
    if ran.code is None:
        return "hang", f"killed after {ran.seconds:.0f} s"
    if ran.code < 0 or any(noise in ran.out for noise in NOISE):
        return "traceback", f"exit {ran.code}: {last_line(ran.out)}"
    errors = error_lines(ran.out)
    if ran.code in codes and len(errors) == 1:
        return "one-line error", f"exit {ran.code}: {errors[0][:160]}"
    if ran.code == 0:
        return "silent wrong", f"exit 0: {last_line(ran.out)}"
    return "traceback", f"exit {ran.code}, {len(errors)} error lines: {last_line(ran.out)}"


def crashed(ran: Ran) -> tuple[str, str] | None:
    """A hang or a traceback, if ``ran`` is one."""
    outcome = refused(ran)
    return outcome if outcome[0] in ("hang", "traceback") else None


def last_line(out: str) -> str:
    lines = [line for line in out.splitlines() if line.strip()]
    return lines[-1][:160] if lines else "(no output)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics_step(workdir: str) -> int:
    """The last step ``{workdir}/metrics.jsonl`` logs (0 before the first)."""
    try:
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            steps = re.findall(r'"step": (\d+)', f.read())
    except OSError:
        return 0
    return max(map(int, steps), default=0)


def mount_tmpfs(path: str, size_kib: int, read_only: bool = False) -> bool:
    """Mount a ``size_kib`` tmpfs at ``path`` (a real full or read-only disk); False where
    this process may not mount (not root)."""
    os.makedirs(path, exist_ok=True)
    options = f"size={size_kib}k" + (",ro" if read_only else "")
    if os.path.ismount(path):
        command = ["mount", "-o", f"remount,{options}", path]
    else:
        command = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", path]
    return subprocess.run(command, capture_output=True).returncode == 0


def unmount(path: str) -> None:
    if os.path.ismount(path):
        subprocess.run(["umount", "-l", path], capture_output=True)


def prepared_copy(reference: str, workdir: str, trained: bool = False) -> str:
    """A fresh workdir with the reference run's tokenizer and data (``trained``: all of it)."""
    if trained:
        shutil.copytree(reference, workdir)
        return workdir
    os.makedirs(workdir)
    shutil.copy(os.path.join(reference, "tokenizer.model"), workdir)
    shutil.copytree(os.path.join(reference, "data_cache"), os.path.join(workdir, "data_cache"))
    return workdir
