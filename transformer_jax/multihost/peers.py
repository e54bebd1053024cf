"""The processes of a multi-host run: agreeing on the launch, and ending together.

After ``jax.distributed.initialize`` each process publishes its launch arguments (its
``--num_processes`` and the run's config) in the coordination service's key-value store
and compares them with process 0's (process 0 with everyone's): :func:`agree` names what
differs. :func:`watch` starts a thread that publishes a heartbeat in the same store and
ends the process with one line when another process has not been heard of for
``timeout_s`` seconds (killed, or its host lost; process 0's coordination service outlives
it for this), before JAX's own heartbeat check aborts it with a C++ dump
(:func:`.distributed.end`).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import jax

from transformer_jax.fields import flatten
from transformer_jax.multihost.distributed import end
from transformer_jax.multihost.jax_private import global_state

_PREFIX = "transformer_jax"


def _differences(mine: dict[str, Any], theirs: dict[str, Any], other: int) -> str | None:
    if mine["num_processes"] != theirs["num_processes"]:
        return (
            f"--num_processes={mine['num_processes']} here but {theirs['num_processes']} on "
            f"process {other}"
        )
    there, here = flatten(theirs["config"]), flatten(mine["config"])
    fields = [*there, *(k for k in here if k not in there)]
    changes = {k: (there.get(k), here.get(k)) for k in fields if there.get(k) != here.get(k)}
    if changes:
        listed = ", ".join(f"{k}={old!r} there, {new!r} here" for k, (old, new) in changes.items())
        return f"the config differs from process {other}'s: {listed}"
    return None


def agree(config: dict[str, Any], num_processes: int | None, timeout_s: float) -> None:
    """ValueError naming the first launch argument (``config``: the run config's dict, its
    ``to_dict()``) that differs between this process and
    process 0 (on process 0: any other), or a process that did not publish its own within
    ``timeout_s``. Every process calls it once, right after initialization."""
    client, me = global_state().client, jax.process_index()
    mine = {"num_processes": num_processes or jax.process_count(), "config": config}
    client.key_value_set(f"{_PREFIX}/launch/{me}", json.dumps(mine))
    others = range(1, jax.process_count()) if me == 0 else [0]
    for other in others:
        try:
            theirs = client.blocking_key_value_get(
                f"{_PREFIX}/launch/{other}", int(timeout_s * 1000)
            )
        except Exception as e:  # noqa: BLE001 - JAX's runtime errors: a timeout, a lost peer
            raise ValueError(
                f"process {other} did not publish its launch arguments within {timeout_s:g} s "
                f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
            ) from None
        differs = _differences(mine, json.loads(theirs), other)
        if differs:
            raise ValueError(f"the processes were launched differently: {differs}")


def watch(timeout_s: float) -> Callable[[], None]:
    """Start the heartbeat thread (see the module's docstring); call the returned function
    once this process ends normally: the thread says so (the others do not count this
    process as lost) and has stopped when it returns, before JAX's client shuts down."""
    finished = threading.Event()
    thread = threading.Thread(
        target=_heartbeat, args=(timeout_s, finished), name="peers", daemon=True
    )
    thread.start()

    def stop() -> None:
        finished.set()
        thread.join(timeout=10)

    return stop


def _heartbeat(timeout_s: float, finished: threading.Event) -> None:
    client, me = global_state().client, jax.process_index()
    start = time.monotonic()
    heard = dict.fromkeys(range(jax.process_count()), start)  # -1: the coordinator
    heard[-1] = start
    last: dict[int, str] = {}
    done: set[int] = {me}
    for beat in itertools.count():
        now = time.monotonic()
        try:
            value = "done" if finished.is_set() else str(beat)
            client.key_value_set(f"{_PREFIX}/alive/{me}", value, allow_overwrite=True)
            if value == "done":
                return
            heard[-1] = now
            for other in heard.keys() - done - {-1}:
                try:
                    value = client.key_value_try_get(f"{_PREFIX}/alive/{other}")
                except Exception:  # noqa: BLE001 - not published yet
                    continue
                if value == "done":
                    done.add(other)
                elif value != last.get(other):
                    last[other], heard[other] = value, now
        except Exception:  # noqa: BLE001 - the coordinator (process 0) is unreachable
            if finished.is_set():
                return  # the run has ended: process 0 stopped the service
        silent = [p for p, t in heard.items() if p not in done and now - t > timeout_s]
        if silent:
            lost = 0 if {-1, 0} & set(silent) else silent[0]  # -1: the coordinator, process 0
            end(
                f"process {lost} of the run has not been heard of for {timeout_s:g} s "
                "(--peer_timeout): stopped, killed or its host lost; every process stops; "
                "relaunch all of them to resume from the last checkpoint"
            )
        finished.wait(min(1.0, timeout_s / 10))


def describe(error: Exception) -> str:
    """The line for an error of a multi-host run: a failed collective means a lost process."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    if "Gloo" in text or "collective" in text.lower():
        return (
            f"another process of the run is lost ({text}); every process stops; relaunch "
            "all of them to resume from the last checkpoint"
        )
    return text
