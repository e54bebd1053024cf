"""A SIGTERM before the train command's loop takes it over exits 75, as a preempted run does.

The package imports this module first: started as ``python -m transformer_jax.train`` or
``transformer-jax train``, the handler is in place before the libraries load (``train.py``
installs its own before its first import). There is nothing to save yet, so the process
ends at once: every file of the workdir is written whole or not at all, and a rerun starts.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import NoReturn

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: rerun to resume
_OPTIONS_WITH_VALUES = {"-W", "-X", "-Q"}


def _preempted_at_start(signum: int, frame: FrameType | None) -> NoReturn:
    os.write(2, b"error: SIGTERM before training started: nothing to save; rerun to start\n")
    os._exit(EXIT_PREEMPTED)


def exit_on_sigterm() -> None:
    """Until the training loop installs its own: a SIGTERM ends the process with 75."""
    signal.signal(signal.SIGTERM, _preempted_at_start)


def runs_training(argv: Sequence[str]) -> bool:
    """Whether the interpreter's command line (``sys.orig_argv``) is the train command."""
    args = iter(argv[1:])
    for arg in args:
        if arg == "-m":
            return next(args, None) == "transformer_jax.train"
        if arg in _OPTIONS_WITH_VALUES:
            next(args, None)
        elif not arg.startswith("-"):  # the script: the console script's first argument
            return os.path.basename(arg) == "transformer-jax" and next(args, None) == "train"
    return False


if runs_training(sys.orig_argv):
    exit_on_sigterm()
