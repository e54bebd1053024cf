"""Signals a training run acts on between steps.

SIGTERM (a scheduler preempting the job) and SIGINT (Ctrl-C) ask the loop to save a
checkpoint and stop after the current step; a second SIGINT stops at once
(``KeyboardInterrupt``). SIGUSR1 asks for a snapshot of the parameters, and training goes
on. The loop reads the requests once per step with :meth:`Signals.poll`, the one place
where every process must agree on them: with several processes, a request received by any
process is acted on by all at the same step (:meth:`Signals.share`).
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable
from typing import Any

from transformer_jax.multihost.distributed import any_process

Handler = Callable[[int, Any], Any] | int  # one signal.signal installs (SIG_IGN, SIG_DFL: ints)

_STOPPING = (signal.SIGTERM, signal.SIGINT)
_STOP_NAMES = tuple(s.name for s in _STOPPING)


@dataclasses.dataclass(frozen=True)
class Requests:
    """What the signals received since the last poll ask of this step boundary."""

    stop: str | None = None  # the name of the signal that asked to stop ("SIGTERM", ...)
    snapshot: bool = False


class Signals:
    """Records SIGTERM/SIGINT (checkpoint and stop) and SIGUSR1 (snapshot) while entered.

    On exit each signal gets back the handler it had, except that SIGTERM gets
    ``sigterm_after`` where one is given: ``signal.SIG_IGN`` for a process that only shuts
    down after, so that no default handler is installed in between to let a late SIGTERM
    kill it while its peers wait for it."""

    def __init__(self, sigterm_after: Handler | None = None) -> None:
        self._sigterm_after = sigterm_after
        self._stop: str | None = None
        self._snapshot = False
        self._previous: dict[int, Handler] = {}
        self._shared: Callable[[], tuple[bool, ...]] | None = None

    def __enter__(self) -> Signals:
        for signum in (*_STOPPING, signal.SIGUSR1):
            try:
                previous = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: no handlers
                break
            # None: a handler installed outside Python, which Python cannot put back
            self._previous[signum] = signal.SIG_DFL if previous is None else previous
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGUSR1:
            self._snapshot = True
        elif signum == signal.SIGINT and self._stop == "SIGINT":
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        else:
            self._stop = self._stop or signal.Signals(signum).name

    def share(self) -> None:
        """Start ORing the requests received so far with the other processes' (a collective:
        every process calls it at the same point); :meth:`poll` returns the result. Called
        before a step is dispatched, the exchange overlaps the step."""
        local = [self._stop == name for name in _STOP_NAMES] + [self._snapshot]
        self._snapshot = False  # answered by the snapshot this exchange leads to
        self._shared = any_process(local)

    def poll(self) -> Requests:
        """The requests for this step boundary, the same on every process (from the last
        :meth:`share`, or from one now); a snapshot request is answered by reading it."""
        if self._shared is None:
            self.share()
        *stops, snapshot = self._shared()
        self._shared = None
        stop = next((name for name, seen in zip(_STOP_NAMES, stops, strict=True) if seen), None)
        return Requests(stop=stop, snapshot=snapshot)

    def __exit__(self, *exc: Any) -> None:
        for signum, previous in self._previous.items():
            after = self._sigterm_after if signum == signal.SIGTERM else None
            signal.signal(signum, previous if after is None else after)
