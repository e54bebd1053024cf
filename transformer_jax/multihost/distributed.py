"""Several processes (hosts) training one model: launch, agreement at each step, one writer.

``launch_arguments`` turns ``train.py``'s ``--multihost``, ``--coordinator_address``,
``--num_processes`` and ``--process_id`` into the arguments of
``jax.distributed.initialize``: the flags take precedence, what they leave out JAX detects
(SLURM, Open MPI, Kubernetes). A process started by a multi-process launcher without the
switch is refused: it would train as an independent job in a shared workdir.
``any_process`` ORs per-step flags (SIGTERM, SIGUSR1) over all processes, so that every
process stops or saves at the same step, and ``sum_over_processes`` adds up what each
process counted (the logged token counts); ``from_process_zero`` runs a computation on
process 0 alone (the tokenizer, which only process 0 writes) and hands its bytes, or its
error, to all; ``entered_by_process_zero`` likewise takes the workdir's lock.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer_jax.multihost import coordinator, jax_private

LAUNCH_FLAGS = ("coordinator_address", "num_processes", "process_id")


def launcher(environ: Mapping[str, str]) -> str | None:
    """The multi-process launcher that started this process (e.g. ``'Open MPI
    (OMPI_COMM_WORLD_SIZE=2)'``), or None for a single process."""
    counts = (
        ("SLURM", "SLURM_STEP_NUM_TASKS"),  # set by srun, not in a batch script itself
        ("Open MPI", "OMPI_COMM_WORLD_SIZE"),
        ("MPICH or Intel MPI", "PMI_SIZE"),
    )
    for name, variable in counts:
        if int(environ.get(variable, "1") or "1") > 1:
            return f"{name} ({variable}={environ[variable]})"
    if environ.get("JAX_COORDINATOR_ADDRESS"):
        return f"JAX_COORDINATOR_ADDRESS={environ['JAX_COORDINATOR_ADDRESS']}"
    return None


def _detectable(environ: Mapping[str, str]) -> bool:
    """Whether ``jax.distributed.initialize`` can read the process count and id itself."""
    slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID")
    return (
        all(v in environ for v in slurm)
        or "OMPI_MCA_orte_hnp_uri" in environ
        or "KUBERNETES_SERVICE_HOST" in environ
    )


def _one_process_per_node(environ: Mapping[str, str]) -> bool:
    slurm = environ.get("SLURM_STEP_NUM_TASKS")
    if slurm is not None and slurm == environ.get("SLURM_STEP_NUM_NODES"):
        return True
    return environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") == "1"


def launch_arguments(
    multihost: bool,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    environ: Mapping[str, str] = os.environ,
) -> dict[str, Any] | None:
    """Keyword arguments of ``jax.distributed.initialize``, or None for one process.

    Any of the three launch values implies ``multihost``. Values left out are detected by
    JAX (SLURM, Open MPI, Kubernetes); ``JAX_COORDINATOR_ADDRESS`` stands for the address.
    Where the launcher starts one process per node, each process uses all the node's
    GPUs (JAX alone would give it the one GPU numbered by its local rank). Raises
    ValueError, naming the flags, when the values cannot be complete or when a launcher
    started several processes without the switch.
    """
    given = dict(zip(LAUNCH_FLAGS, (coordinator_address, num_processes, process_id), strict=True))
    if not multihost and all(v is None for v in given.values()):
        found = launcher(environ)
        if found:
            raise ValueError(
                f"launched as one of several processes by {found}, but without --multihost: "
                "each would train alone in the same workdir; add --multihost (README, "
                "Multi-host) or start a single process"
            )
        return None
    if given["coordinator_address"] is None:
        given["coordinator_address"] = environ.get("JAX_COORDINATOR_ADDRESS") or None
    missing = [f"--{name}" for name, value in given.items() if value is None]
    if missing and not _detectable(environ):
        raise ValueError(
            f"--multihost needs {', '.join(missing)}: no SLURM, Open MPI or Kubernetes "
            "environment gives them (README, Multi-host)"
        )
    if given["num_processes"] is not None and given["process_id"] is not None:
        if not 0 <= given["process_id"] < given["num_processes"]:
            raise ValueError(
                f"--process_id must be in [0, --num_processes={given['num_processes']}), "
                f"got {given['process_id']}"
            )
    if _one_process_per_node(environ):
        given["local_device_ids"] = []  # no restriction: every device of the node
    return given


def initialize(
    multihost: bool, initialization_timeout: float = 30, peer_timeout: float = 30, **launch: Any
) -> bool:
    """``jax.distributed.initialize`` with :func:`launch_arguments`; whether it ran.

    Processes that have not all connected within ``initialization_timeout`` seconds (a
    process missing, a wrong address or port, a count or id that differs) end with one line
    (:func:`end`) before JAX's own timeout aborts them. JAX's heartbeat check waits longer
    than ``peer_timeout``, the time :mod:`.peers` gives a silent process. Process 0 (given
    by the flags) hosts the coordination service in a child process (:mod:`.coordinator`),
    so that the others outlive a killed process 0 long enough to end with one line.
    ValueError, before connecting, if the installed jax lacks a private name that a run of
    several processes uses (:mod:`.jax_private`).
    """
    arguments = launch_arguments(multihost, **launch)
    if arguments is None:
        return False
    if missing := jax_private.missing():
        raise ValueError(missing[0])
    address = arguments["coordinator_address"] or "the launcher's coordinator"
    failed = (
        f"the {arguments['num_processes'] or 'launched'} processes did not all connect to "
        f"{address} within --initialization_timeout={initialization_timeout:g} s: every "
        "process needs the same --coordinator_address (reachable, the port free on process "
        "0's host) and --num_processes, and its own --process_id"
    )
    timer = threading.Timer(initialization_timeout, end, [failed])
    timer.daemon = True
    timer.start()
    heartbeat_s = int(2 * peer_timeout) + 30
    try:
        if arguments["process_id"] == 0 and None not in arguments.values():
            arguments["coordinator_bind_address"] = _start_coordinator(
                arguments, heartbeat_s, grace_s=peer_timeout + 15
            )
        with jax_private.connect_errors_raised():
            jax.distributed.initialize(
                **arguments,
                initialization_timeout=int(initialization_timeout) + 30,
                heartbeat_timeout_seconds=heartbeat_s,
            )
    except Exception as e:  # noqa: BLE001 - JAX's runtime errors
        end(f"{failed} ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
    finally:
        timer.cancel()
    global _connected
    _connected = True
    return True


_coordinator: subprocess.Popen[bytes] | None = None  # process 0's coordination service


def _start_coordinator(arguments: Mapping[str, Any], heartbeat_s: int, grace_s: float) -> str:
    """Start :mod:`.coordinator` on the coordinator address's port; the address, on a free
    port, where JAX may start its own (unused) service in this process. RuntimeError with
    the child's last line if it does not start."""
    global _coordinator
    port = arguments["coordinator_address"].rsplit(":", 1)[1]
    bind = os.environ.get("JAX_COORDINATOR_BIND_ADDRESS", f"[::]:{port}")
    errors = tempfile.TemporaryFile()
    command = [sys.executable, "-m", coordinator.__name__, bind, str(arguments["num_processes"])]
    _coordinator = subprocess.Popen(
        [*command, str(heartbeat_s), str(grace_s)],
        env=with_package_on_path(os.environ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errors,
        start_new_session=True,
    )
    assert _coordinator.stdout is not None
    if _coordinator.stdout.readline().strip() != b"ready":  # its end: it failed
        _coordinator.wait()
        errors.seek(0)
        lines = errors.read().decode(errors="replace").strip().splitlines() or ["no output"]
        raise RuntimeError(f"the coordination service did not start on {bind}: {lines[-1]}")
    return "127.0.0.1:0"


def _coordinator_done(wait: bool) -> None:
    """Tell process 0's coordination service that the run has ended: it stops once this
    process has closed its stdin (at once with ``wait``, which waits for it; else at exit)."""
    if _coordinator is not None and _coordinator.poll() is None:
        with contextlib.suppress(OSError):
            assert _coordinator.stdin is not None
            _coordinator.stdin.write(b"done\n")
            _coordinator.stdin.flush()
            if wait:
                _coordinator.stdin.close()
                _coordinator.wait(timeout=10)


def finish() -> None:
    """End a run of several processes that ended normally: JAX's shutdown (every process
    waits there for the others), then process 0's coordination service."""
    jax.distributed.shutdown()
    _coordinator_done(wait=True)


def with_package_on_path(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` for a child process that imports this same transformer_jax: the folder
    holding the package goes first on PYTHONPATH where only this process's first path
    entry (``python train.py``'s folder) found it."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root in (os.path.abspath(path) for path in sys.path[1:]):
        return dict(environ)  # found there by a child as well (installed, or PYTHONPATH)
    paths = [root, *filter(None, environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**environ, "PYTHONPATH": os.pathsep.join(paths)}


_ending = threading.Lock()
_connected = False  # initialize() has returned: the coordination service is reachable
_ENDED = "transformer_jax/ended/"


def end(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` (once, whichever thread gets here first) and exit ``code``
    at once, skipping JAX's shutdown, which would wait for every process to reach it (one
    is lost, or never came) and abort. Only for a run of several processes: what it saved
    is saved, and the other processes end too. Process 0 waits (5 s at most) until they
    have said they end, then stops its coordination service (:mod:`.coordinator`, which
    otherwise outlives it a while, so that the others still end with one line)."""
    if not _ending.acquire(blocking=False):
        while True:  # another thread is ending the process
            time.sleep(1)
    sys.stdout.flush()
    print(f"error: {message}", file=sys.stderr, flush=True)
    state = jax_private.global_state()
    client, me = state.client, state.process_id
    if not _connected:  # no process got past connecting: none needs the service
        _coordinator_done(wait=False)
    try:
        if _connected and me != 0:
            client.key_value_set(f"{_ENDED}{me}", "")
        deadline = time.monotonic() + 5
        while _connected and me == 0 and time.monotonic() < deadline:
            if len(client.key_value_dir_get(_ENDED)) >= state.num_processes - 1:
                _coordinator_done(wait=False)  # else it outlives this process a while
                break
            time.sleep(0.1)
    except Exception:  # noqa: BLE001, S110 - the service is gone: nothing to wait for
        pass
    os._exit(code)


@functools.cache
def _sum_over_processes() -> tuple[NamedSharding, Callable[[jax.Array], jax.Array]]:
    devices = np.array(jax.devices()).reshape(jax.process_count(), jax.local_device_count())
    mesh = Mesh(devices, ("processes", "local"))
    total = jax.jit(lambda x: jnp.sum(x, axis=0), out_shardings=NamedSharding(mesh, P()))
    return NamedSharding(mesh, P("processes")), total


def sum_over_processes(values: Sequence[int]) -> Callable[[], tuple[int, ...]]:
    """Start summing ``values`` (int32) over all processes; the returned function gives
    the sums. Every process must call it at the same point (it is a collective); the result
    is read later, so that the collective overlaps what is dispatched in between."""
    local = np.asarray([values], np.int32)
    if jax.process_count() == 1:
        return lambda: tuple(int(v) for v in local[0])
    sharding, total = _sum_over_processes()
    summed = total(jax.make_array_from_process_local_data(sharding, local))
    return lambda: tuple(int(v) for v in np.asarray(summed.addressable_data(0)))


def any_process(flags: Sequence[bool]) -> Callable[[], tuple[bool, ...]]:
    """Start ORing ``flags`` over all processes, like :func:`sum_over_processes`."""
    sums = sum_over_processes([int(bool(f)) for f in flags])
    return lambda: tuple(v > 0 for v in sums())


def from_process_zero(make: Callable[[], bytes]) -> bytes:
    """``make()`` run by process 0 alone, its bytes broadcast to every process.

    An error on process 0 is raised there and, as a ValueError with its message, on the
    other processes, so that every process stops with one line and none waits forever.
    """
    if jax.process_count() == 1:
        return make()
    payload, error = b"", None
    if jax.process_index() == 0:
        try:
            payload = make()
        except Exception as e:  # noqa: BLE001 - re-raised below, its message sent to all
            error, payload = e, str(e).encode()
    header = np.array([error is None, len(payload)], np.int32)
    ok, size = multihost_utils.broadcast_one_to_all(header)
    data = np.frombuffer(payload, np.uint8) if payload else np.zeros(int(size), np.uint8)
    if size:
        data = multihost_utils.broadcast_one_to_all(data)
    if error is not None:
        raise error
    if not ok:
        raise ValueError(f"process 0: {data.tobytes().decode()}")
    return data.tobytes()


@contextlib.contextmanager
def entered_by_process_zero(
    context: Callable[[], contextlib.AbstractContextManager[Any]],
) -> Iterator[None]:
    """Enter ``context()`` on process 0 alone (e.g. the workdir's lock); a ValueError from
    entering it is raised on every process (:func:`from_process_zero`)."""
    with contextlib.ExitStack() as stack:

        def enter() -> bytes:
            stack.enter_context(context())
            return b""

        from_process_zero(enter)
        yield
