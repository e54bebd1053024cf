"""A SIGTERM before the training loop takes it over exits 75, as a preempted run does.

The train command installs :func:`exit_on_sigterm` as it starts (``train.py`` before its
first import, :func:`transformer_jax.cli.train.main` first thing), and the loop replaces it
with its own (:mod:`.signals`). There is nothing to save yet, so the process ends at once
with one line: every file of the workdir is written whole or not at all, and a rerun
starts. This module imports nothing but the standard library, so that ``train.py`` can
install the handler before anything heavy loads.
"""

from __future__ import annotations

import os
import signal
from types import FrameType
from typing import NoReturn

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: rerun to resume
STOPPED_BEFORE_TRAINING = (
    "stopped by SIGTERM before training began: nothing was saved and nothing is lost; "
    "rerun to start"
)


def _preempted_at_start(signum: int, frame: FrameType | None) -> NoReturn:
    os.write(2, f"error: {STOPPED_BEFORE_TRAINING}\n".encode())
    os._exit(EXIT_PREEMPTED)


def exit_on_sigterm() -> None:
    """Until the training loop installs its own: a SIGTERM ends the process with one line
    and exit code 75."""
    signal.signal(signal.SIGTERM, _preempted_at_start)
