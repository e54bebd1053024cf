"""The batches of the coming training steps, read and placed on the devices ahead of time.

A step takes ``grad_accum_steps`` micro-batches from the :class:`~transformer_jax.data.
TrainIterator`, each placed on the devices by ``put`` (``Parallel.put_batch``: this
process's share over its local devices). With ``depth > 0`` a background thread keeps
``depth`` steps' batches ready (and holds the next one until there is room); with
``depth == 0`` they are read when the step asks. Either way
:attr:`StepBatches.data_state` is the iterator state after the batches the training
thread has taken, never after those read ahead, so a checkpoint resumes exactly; and
:attr:`StepBatches.last_wait` is the seconds the training thread waited for a step's
batches.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from transformer_jax.data.batching import Batch, TrainIterator

_POLL_S = 0.05  # how often a producer blocked on a full queue checks for the stop request


@dataclasses.dataclass(frozen=True)
class Step:
    """One step's micro-batches: as read (for token counts) and as placed on the devices."""

    host: list[Batch]
    placed: list[Any]
    data_state: dict[str, int]  # the iterator state after these batches
    dropped_too_long: int


@dataclasses.dataclass(frozen=True)
class _Failed:
    error: BaseException


class StepBatches:
    """Each step's batches, from :meth:`next_step`; a context manager that stops its thread."""

    def __init__(
        self,
        train_iter: TrainIterator,
        put: Callable[[Batch], Any],
        micro_batches: int,
        depth: int,
    ):
        self.train_iter, self.put, self.micro_batches = train_iter, put, micro_batches
        self.data_state = train_iter.get_state()
        self.dropped_too_long = int(train_iter.stats()["dropped_too_long"])
        self.last_wait = 0.0
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._thread = None
        if depth:
            self._thread = threading.Thread(target=self._produce, name="prefetch", daemon=True)
            self._thread.start()

    def _read(self) -> Step:
        host = [next(self.train_iter) for _ in range(self.micro_batches)]
        placed = [self.put(batch) for batch in host]
        dropped = int(self.train_iter.stats()["dropped_too_long"])
        return Step(host, placed, self.train_iter.get_state(), dropped)

    def _produce(self) -> None:
        while not self._stop.is_set():
            try:
                item: Step | _Failed = self._read()
            except BaseException as e:  # noqa: BLE001 - raised again on the training thread
                item = _Failed(e)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _Failed):
                return

    def next_step(self) -> Step:
        """The next step's batches; an error of the thread that read them is raised here."""
        started = time.perf_counter()
        item = self._read() if self._thread is None else self._queue.get()
        self.last_wait = time.perf_counter() - started
        if isinstance(item, _Failed):
            raise item.error
        self.data_state, self.dropped_too_long = item.data_state, item.dropped_too_long
        return item

    def close(self) -> None:
        """Stop the thread and drop the batches read ahead."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        while not self._queue.empty():
            self._queue.get_nowait()

    def __enter__(self) -> StepBatches:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
