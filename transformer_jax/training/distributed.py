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
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

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


def initialize(multihost: bool, **launch: Any) -> bool:
    """``jax.distributed.initialize`` with :func:`launch_arguments`; whether it ran."""
    arguments = launch_arguments(multihost, **launch)
    if arguments is None:
        return False
    jax.distributed.initialize(**arguments)
    return True


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
