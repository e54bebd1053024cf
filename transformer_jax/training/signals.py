"""Signals a training run acts on between steps.

SIGTERM (a scheduler preempting the job) and SIGINT (Ctrl-C) ask the loop to save a
checkpoint and stop after the current step; a second SIGINT stops at once
(``KeyboardInterrupt``). SIGUSR1 asks for a snapshot of the parameters, and training goes
on. The loop reads the requests once per step with :meth:`Signals.poll`, the one place
where every process must agree on them.
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Any

_STOPPING = (signal.SIGTERM, signal.SIGINT)


@dataclasses.dataclass(frozen=True)
class Requests:
    """What the signals received since the last poll ask of this step boundary."""

    stop: str | None = None  # the name of the signal that asked to stop ("SIGTERM", ...)
    snapshot: bool = False


class Signals:
    """Records SIGTERM/SIGINT (checkpoint and stop) and SIGUSR1 (snapshot) while entered."""

    def __init__(self) -> None:
        self._stop: str | None = None
        self._snapshot = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        for signum in (*_STOPPING, signal.SIGUSR1):
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: no handlers
                break
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGUSR1:
            self._snapshot = True
        elif signum == signal.SIGINT and self._stop == "SIGINT":
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        else:
            self._stop = self._stop or signal.Signals(signum).name

    def poll(self) -> Requests:
        """The requests for this step boundary; a snapshot request is answered by reading it."""
        requests = Requests(stop=self._stop, snapshot=self._snapshot)
        self._snapshot = False
        return requests

    def __exit__(self, *exc: Any) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
