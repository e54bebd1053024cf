"""The multi-host trials of ``hostile_trials.py``: two ``train.py`` processes on 127.0.0.1
launched with a mistake (process counts that differ, a wrong port, a process id twice,
configs that differ), one of them sent SIGTERM, or one of them killed mid-run (the loss of
a process); every process must end within seconds, with one line or saved (exit 75), and
the checkpoints written so far must load."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import _hostile_runs as hr

from transformer_jax.training import checkpoints

TIMEOUTS = ["--initialization_timeout=20", "--peer_timeout=5"]
BOUND_S = 60  # after the mistake or the kill, every process has ended within this


def _launch_flags(case: str) -> list[list[str]]:
    address, wrong = f"127.0.0.1:{hr.free_port()}", f"127.0.0.1:{hr.free_port()}"
    flags = [
        [f"--coordinator_address={address}", "--num_processes=2", f"--process_id={i}"]
        for i in range(2)
    ]
    if case == "num_processes 3 and 2":
        flags[0][1] = "--num_processes=3"
    elif case == "num_processes 2 and 3":
        flags[1][1] = "--num_processes=3"
    elif case == "wrong port":
        flags[1][0] = f"--coordinator_address={wrong}"
    elif case == "process_id 0 twice":
        flags[1][2] = "--process_id=0"
    elif case == "process_id 1 twice":
        flags[0][2] = "--process_id=1"
    elif case == "different configs":
        flags[1].append("--config.model.d_model=64")
    return flags


def _ended(ran: hr.Ran) -> tuple[str, str]:
    """Stopped and saved by SIGTERM (exit 75, no error line), or refused in one line."""
    clean = not any(noise in ran.out for noise in hr.NOISE) and not hr.error_lines(ran.out)
    if ran.code == 75 and clean:
        return "OK", "exit 75 (saved, stopped)"
    return hr.refused(ran, codes=(1,))


def _checkpoints_load(workdir: str) -> tuple[str, str] | None:
    """Data loss if the newest checkpoint written does not load."""
    if not checkpoints_written(workdir):
        return None
    try:
        checkpoints.load_run(workdir)
    except Exception as e:  # noqa: BLE001 - any failure to load is the finding
        return "data loss", f"the checkpoints do not load: {type(e).__name__}: {e}"[:200]
    return None


def checkpoints_written(workdir: str) -> list[str]:
    folder = os.path.join(workdir, checkpoints.CHECKPOINT_DIR)
    return [n for n in os.listdir(folder) if n.isdigit()] if os.path.isdir(folder) else []


def _worst(outcomes: list[tuple[str, str]]) -> tuple[str, str]:
    return max(outcomes, key=lambda o: hr.OUTCOMES.index(o[0]))


def launched(case: str) -> Callable[[str, str, float], tuple[str, str]]:
    def trial(reference: str, tmp: str, timeout: float) -> tuple[str, str]:
        workdir = hr.prepared_copy(reference, os.path.join(tmp, "run"))
        signalled = case.split()[0] in ("kill", "sigterm")
        extra = ["--config.train.num_steps=5000"] if signalled else []
        procs = [
            hr.start(hr.train_command(workdir, *TIMEOUTS, *extra, *own), f"{workdir}.{i}.log")
            for i, own in enumerate(_launch_flags(case))
        ]
        if signalled:
            if not hr.wait_until(lambda: hr.metrics_step(workdir) >= 3, procs, timeout):
                return _worst([hr.refused(hr.wait(p, 1)) for p in procs])
            index = int(case.split()[-1])
            if case.startswith("kill"):  # the loss of a process: only the other one reports
                procs[index].kill()
                procs[index].wait()
                procs.pop(index)
            else:
                procs[index].send_signal(signal.SIGTERM)
        ran = [hr.wait(p, min(timeout, BOUND_S + 40)) for p in procs]
        outcome = _worst([_ended(r) for r in ran])
        if outcome[0] in ("OK", "one-line error") and max(r.seconds for r in ran) > timeout:
            return "hang", f"ended after {max(r.seconds for r in ran):.0f} s"
        if outcome[0] in ("OK", "one-line error") and (lost := _checkpoints_load(workdir)):
            return lost
        if signalled and outcome[0] in ("OK", "one-line error"):
            saved = sorted(map(int, checkpoints_written(workdir)))
            return outcome[0], f"{outcome[1]}; checkpoints {saved[-3:]} load"
        return outcome

    return trial


def multihost_trials() -> dict[str, tuple[str, Callable[[str, str, float], tuple[str, str]]]]:
    """The trials by name, each with its group (``multihost``, ``concurrency``, ``loss``)."""
    cases = {
        "num_processes 3 and 2": "multihost",
        "num_processes 2 and 3": "multihost",
        "wrong port": "multihost",
        "process_id 0 twice": "multihost",
        "different configs": "multihost",
        "sigterm process 0": "multihost",
        "sigterm process 1": "multihost",
        "process_id 1 twice": "concurrency",
        "kill process 0": "loss",
        "kill process 1": "loss",
    }
    return {f"multihost {case}": (group, launched(case)) for case, group in cases.items()}
