"""The private parts of JAX that multi-host runs use, all here, each looked up by name.

JAX has no public handle on its coordination service and client. A multi-host run uses
three private ones: the service, started in a process of its own (:mod:`.coordinator`);
the client of ``jax.distributed``'s global state, whose key-value store the processes share
(:mod:`.peers`, :func:`.distributed.end`); and the client's factory, given an error
callback while connecting (:func:`connect_errors_raised`). Each is looked up when used, and
a jax that lacks one raises :class:`MissingPrivateAPI`, naming it and the installed jax's
version (:func:`missing` lists them; ``tests/multihost`` checks the installed jax). Only
``importlib.metadata`` is read to name the version: the coordinator's process imports no
jax package.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
from collections.abc import Iterator
from typing import Any

WRITTEN_FOR = "0.10.2"  # the jax whose private modules these names are from

# name -> (module, attribute path in it, what the run uses it for)
PRIVATE: dict[str, tuple[str, str, str]] = {
    "service": (
        "jaxlib._jax",
        "get_distributed_runtime_service",
        "process 0's coordination service in a child process",
    ),
    "global_state": (
        "jax._src.distributed",
        "global_state.client",
        "the coordination client's key-value store (heartbeats, launch arguments)",
    ),
    "process_id": (
        "jax._src.distributed",
        "global_state.process_id",
        "this process's index, to say it ended",
    ),
    "num_processes": (
        "jax._src.distributed",
        "global_state.num_processes",
        "the processes process 0 waits for as it ends",
    ),
    "client_factory": (
        "jax._src.distributed",
        "_jax.get_distributed_runtime_client",
        "an error callback for the client while it connects",
    ),
}


class MissingPrivateAPI(ValueError):
    """The installed jax lacks a private name that multi-host runs use."""


def jax_version() -> str:
    try:
        return importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _message(name: str, error: Exception) -> str:
    module, path, purpose = PRIVATE[name]
    return (
        f"jax {jax_version()} has no {module}.{path} ({purpose}; {type(error).__name__}: "
        f"{error}): multi-host runs were written for jax {WRITTEN_FOR}; install it, or update "
        "transformer_jax/multihost/jax_private.py"
    )


def _owner(name: str) -> tuple[Any, str]:
    """The object holding ``PRIVATE[name]``'s last attribute, and that attribute's name;
    :class:`MissingPrivateAPI` if the installed jax lacks it."""
    module, path, _ = PRIVATE[name]
    *parents, last = path.split(".")
    try:
        owner = importlib.import_module(module)
        for attribute in parents:
            owner = getattr(owner, attribute)
        getattr(owner, last)
    except (ImportError, AttributeError) as e:
        raise MissingPrivateAPI(_message(name, e)) from None
    return owner, last


def lookup(name: str) -> Any:
    """The object ``PRIVATE[name]`` names; :class:`MissingPrivateAPI` if jax lacks it."""
    owner, attribute = _owner(name)
    return getattr(owner, attribute)


def missing() -> list[str]:
    """One line for each private name the installed jax lacks (none: all are there)."""
    lines = []
    for name in PRIVATE:
        try:
            lookup(name)
        except MissingPrivateAPI as e:
            lines.append(str(e))
    return lines


def coordination_service(bind: str, num_processes: int, heartbeat_s: int) -> Any:
    """A coordination service listening on ``bind`` for ``num_processes`` clients."""
    make = lookup("service")
    return make(bind, num_processes, heartbeat_timeout=heartbeat_s, shutdown_timeout=heartbeat_s)


def global_state() -> Any:
    """``jax.distributed``'s state: ``client``, ``process_id``, ``num_processes``."""
    for name in ("process_id", "num_processes"):
        lookup(name)
    state, _ = _owner("global_state")  # its client is None until initialized
    return state


@contextlib.contextmanager
def connect_errors_raised() -> Iterator[None]:
    """Give the coordination client an error callback while ``jax.distributed.initialize``
    connects: without one, an error while connecting (e.g. a second process with the same
    id) aborts the process with a C++ dump; with one, JAX 0.10 raises it from ``connect``
    (the callback itself is not called with the error). ``initialize`` takes no callback:
    the private client factory is patched for the duration."""
    runtime, attribute = _owner("client_factory")
    make = getattr(runtime, attribute)

    def with_callback(*args: Any, **kwargs: Any) -> Any:
        return make(*args, missed_heartbeat_callback=lambda *_: None, **kwargs)

    setattr(runtime, attribute, with_callback)
    try:
        yield
    finally:
        setattr(runtime, attribute, make)
