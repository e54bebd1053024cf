"""quality.py's clock: ``train.py`` processes run for a wall-clock budget, then stopped.

At each budget mark but the last a run gets SIGUSR1 (it saves a parameter snapshot and goes
on), at the last SIGTERM (it checkpoints and exits with ``EXIT_PREEMPTED``). Several runs side
by side each keep their own clock and, optionally, their own CPU cores.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from _common import ROOT

from transformer_jax.cli.flags import EXIT_PREEMPTED


def parse_marks(text: str) -> list[float]:
    """``'30,60'`` -> ``[30.0, 60.0]``: positive and ascending, else ValueError."""
    try:
        marks = [float(m) for m in text.split(",")]
    except ValueError:
        raise ValueError(f"--minutes must be numbers separated by commas, got {text!r}") from None
    if any(m <= 0 for m in marks) or marks != sorted(set(marks)):
        raise ValueError(f"--minutes must be positive and ascending, got {text!r}")
    return marks


def train_within_budget(
    command: list[str], marks: list[float], log_path: str, clock_file: str | None = None
) -> dict[str, Any]:
    """Run ``command``; at each of ``marks`` (minutes, ascending) but the last send SIGUSR1
    (the loop saves a parameter snapshot and goes on), at the last SIGTERM (the loop
    checkpoints and exits with ``EXIT_PREEMPTED``). The minutes count from the start of
    ``command``, or with ``clock_file`` from when that file appears. Returns timings."""
    return train_side_by_side([command], marks, [log_path], [clock_file])[0]


def train_side_by_side(
    commands: list[list[str]],
    marks: list[float],
    log_paths: list[str],
    clock_files: list[str | None],
    cpus: list[set[int]] | None = None,
) -> list[dict[str, Any]]:
    """:func:`train_within_budget` for several commands at once, each with its own clock
    (and, with ``cpus``, on its own CPU cores). Returns each one's timings."""
    launched, n = time.perf_counter(), len(commands)
    starts: list[float | None] = [None] * n
    ends: list[float | None] = [None] * n  # when the last mark was signalled, or the exit
    signalled, stopped, exited = [0] * n, [False] * n, [0.0] * n
    if cpus is not None:
        commands = [pinned(command, c) for command, c in zip(commands, cpus, strict=True)]
    logs = [open(path, "w") for path in log_paths]  # noqa: SIM115  (closed below)
    try:
        procs = [
            subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
            for command, log in zip(commands, logs, strict=True)
        ]
        while not all(exited):
            now = time.perf_counter()
            for i, proc in enumerate(procs):
                if exited[i]:
                    continue
                running = proc.poll() is None
                if starts[i] is None and (
                    not clock_files[i] or os.path.exists(clock_files[i]) or not running
                ):
                    starts[i] = launched if not clock_files[i] else now
                if not running:
                    exited[i], ends[i] = now, ends[i] or now
                    continue
                while starts[i] is not None and signalled[i] < len(marks):
                    if now - starts[i] < marks[signalled[i]] * 60:
                        break
                    last = signalled[i] == len(marks) - 1
                    proc.send_signal(signal.SIGTERM if last else signal.SIGUSR1)
                    stopped[i], ends[i] = last, now if last else None
                    signalled[i] += 1
            time.sleep(0.02)
        returncodes = [proc.wait() for proc in procs]
    finally:
        for log in logs:
            log.close()
    for path, returncode, stop in zip(log_paths, returncodes, stopped, strict=True):
        if returncode != 0 and not (stop and returncode == EXIT_PREEMPTED):
            with open(path) as f:
                tail = f.read()[-3000:]
            hint = " (the budget ended before the training loop started?)" if stop else ""
            raise RuntimeError(f"training failed (exit {returncode}){hint}; end of {path}:\n{tail}")
    return [
        {
            "setup_s": starts[i] - launched,  # before the clock started (0 without a clock file)
            "train_wall_s": ends[i] - starts[i],
            "exit_wall_s": exited[i] - starts[i],
            "stopped_by_budget": stopped[i],
        }
        for i in range(n)
    ]


def pinned(command: list[str], cpus: set[int]) -> list[str]:
    """``command`` run on the CPU cores ``cpus`` only (set in a Python process that then
    becomes the command, so no code runs between fork and exec in this one)."""
    pin = "import os, sys; os.sched_setaffinity(0, {}); os.execvp(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", pin.format(sorted(cpus)), *command]


def member_cpus(members: int) -> list[set[int]]:
    """This process's CPU cores split into ``members`` equal contiguous shares."""
    cores = sorted(os.sched_getaffinity(0))
    if members > len(cores):
        raise ValueError(
            f"--ensemble {members} needs a core per model; this process has {len(cores)}"
        )
    share = len(cores) // members
    return [set(cores[i * share : (i + 1) * share]) for i in range(members)]
