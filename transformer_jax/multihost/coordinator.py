"""The coordination service of a multi-host run, in a process of its own beside process 0.

JAX hosts the service inside process 0: a killed process 0 takes it along, and JAX's client
then aborts every other process with a C++ dump. :func:`.distributed.initialize` starts
this module as process 0's child instead (``python -m transformer_jax.multihost.coordinator
BIND PROCESSES HEARTBEAT_S GRACE_S``; it imports the service alone: no JAX client, backends
or jax package), in a session of its own (a Ctrl-C or a launcher's signal is
process 0's to act on). It prints ``ready`` once the service listens, then reads its
stdin: ``done`` (the run ended) stops the service once process 0 closes stdin; the end of
stdin without it (process 0 died) keeps the service ``GRACE_S`` seconds more, long enough
for the other processes' heartbeat (:mod:`.peers`) to notice and end each with one line.
"""

from __future__ import annotations

import os
import sys
import time

from transformer_jax.multihost.jax_private import coordination_service


def main(bind: str, num_processes: int, heartbeat_s: int, grace_s: float) -> None:
    """Run the service until process 0 says ``done`` or ``grace_s`` after it is gone."""
    service = coordination_service(bind, num_processes, heartbeat_s)
    print("ready", flush=True)
    if sys.stdin.readline().strip() == "done":
        sys.stdin.read()  # until process 0 has closed its end: its client is gone
        service.shutdown()
    else:
        time.sleep(grace_s)
    os._exit(0)  # no waiting on clients that are gone


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
