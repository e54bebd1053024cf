"""The multi-host trials of ``hostile_trials.py``: two ``train.py`` processes on 127.0.0.1
launched with a mistake (process counts that differ, a wrong port, process id 0 twice) or
one of them killed mid-run; every process must end with one line within seconds."""

from __future__ import annotations

import os
from collections.abc import Callable

import _hostile_runs as hr

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
    return flags


def _worst(outcomes: list[tuple[str, str]]) -> tuple[str, str]:
    return max(outcomes, key=lambda o: hr.OUTCOMES.index(o[0]))


def launched(case: str) -> Callable[[str, str, float], tuple[str, str]]:
    def trial(reference: str, tmp: str, timeout: float) -> tuple[str, str]:
        workdir = hr.prepared_copy(reference, os.path.join(tmp, "run"))
        extra = [*TIMEOUTS, "--config.train.num_steps=5000"] if case.startswith("kill") else []
        procs = [
            hr.start(hr.train_command(workdir, *TIMEOUTS, *extra, *own), f"{workdir}.{i}.log")
            for i, own in enumerate(_launch_flags(case))
        ]
        if case.startswith("kill"):
            metrics = os.path.join(workdir, "metrics.jsonl")
            if not hr.wait_until(lambda: os.path.isfile(metrics), procs, timeout):
                return _worst([hr.refused(hr.wait(p, 1)) for p in procs])
            killed = int(case.split()[-1])
            procs[killed].kill()
            procs[killed].wait()
            procs.pop(killed)
        ran = [hr.wait(p, min(timeout, BOUND_S + 40)) for p in procs]
        outcome = _worst([hr.refused(r, codes=(1,)) for r in ran])
        if outcome[0] == "one-line error" and max(r.seconds for r in ran) > timeout:
            return "hang", f"ended after {max(r.seconds for r in ran):.0f} s"
        return outcome

    return trial


def multihost_trials() -> dict[str, Callable[[str, str, float], tuple[str, str]]]:
    cases = [
        "num_processes 3 and 2",
        "num_processes 2 and 3",
        "wrong port",
        "process_id 0 twice",
        "kill process 0",
        "kill process 1",
    ]
    return {f"multihost {case}": launched(case) for case in cases}
