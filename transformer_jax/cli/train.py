"""Train a Transformer: ``python train.py`` trains the config ``tiny`` on the embedded data.

    python train.py --config base --workdir runs/base
    python train.py --config tiny --config.train.num_steps=500

(``transformer-jax train`` and ``python -m transformer_jax.train`` are the same command.)
``--config`` takes a packaged config's name (tiny, base, big, multi30k; ``multi30k:60``
passes ``60`` to its ``get_config``) or a config file's path (``configs/base.py`` in a
clone). Any config field can be overridden with ``--config.<section>.<field>=value``; the
workdir defaults to ``runs/<config name>``. Rerunning resumes from the last checkpoint.
``--multihost`` starts one process of a run over several hosts (README, Multi-host):
``--coordinator_address``, ``--num_processes`` and ``--process_id``, or what SLURM, Open MPI
or Kubernetes tell JAX; each process trains on its share of every batch;
``--initialization_timeout`` and ``--peer_timeout`` bound how long the processes wait for
each other before every one stops with one line. The config fields, with their types,
defaults, checks and help, are listed at the end of ``--help`` (``training/schema.py``) and
checked before the library is imported; a run's config is ``{workdir}/config.json``.

The run starts with the line ``workdir: PATH`` and ends with the line naming what it keeps
there (the checkpoints, config.json and metrics.jsonl).

Exit codes (the commands' table: README, Exit codes): 0 trained and evaluated (or already
complete); 1 an error, printed as one line (a bad config value or file, data, a non-finite
loss, a full disk); 2 a command line the flags reject (an unknown flag or config field);
75 stopped by SIGTERM (preempted, at any point; once training started, after saving a
checkpoint): rerun to resume; 130 stopped by Ctrl-C (SIGINT; saved like SIGTERM, a second
Ctrl-C stops at once). A SIGTERM after the last step lets the final evaluation finish
(exit 0); once the run is saved, further SIGTERMs are ignored while the process exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from absl import flags, logging

from transformer_jax.cli.flags import (
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    Failure,
    config_and_workdir,
    define_cache_flags,
    define_config_flag,
    run,
)
from transformer_jax.multihost.preemption import exit_on_sigterm
from transformer_jax.training.schema import RunConfig

_STOPPED = {"SIGTERM": EXIT_PREEMPTED, "SIGINT": EXIT_INTERRUPTED}


def define_flags(values: flags.FlagValues, argv: list[str]) -> None:
    """The command's flags (a :data:`transformer_jax.cli.flags.Define`)."""
    define_config_flag(values, argv)
    define_cache_flags(values)
    define = {"flag_values": values}
    flags.DEFINE_string("workdir", None, "Output directory (default runs/<config name>).", **define)
    flags.DEFINE_bool(
        "multihost",
        False,
        "One process of a run over several processes (jax.distributed).",
        **define,
    )
    flags.DEFINE_string(
        "coordinator_address", None, "host:port of process 0 (implies --multihost).", **define
    )
    flags.DEFINE_integer(
        "num_processes", None, "Processes in the run (implies --multihost).", **define
    )
    flags.DEFINE_integer(
        "process_id",
        None,
        "This process's index, 0 to num_processes - 1 (implies --multihost).",
        **define,
    )
    flags.DEFINE_float(
        "initialization_timeout",
        30,
        "Seconds for every process of a multi-host run to connect and agree on its launch.",
        lower_bound=1,
        **define,
    )
    flags.DEFINE_float(
        "peer_timeout",
        30,
        "Seconds a process of a multi-host run may go unheard before every process stops.",
        lower_bound=1,
        **define,
    )


@contextlib.contextmanager
def quiet_orbax() -> Iterator[None]:
    """Leave a failed save to the loop's one line: Orbax logs it from each writer thread, and
    asyncio reports "Event loop is closed" once per write still pending. Both only while
    training: the absl logger's filter and ``sys.unraisablehook`` are restored after."""
    logger, hook = logging.get_absl_logger(), sys.unraisablehook

    def orbax_filter(record: Any) -> bool:
        return "orbax" not in record.pathname

    def unraisablehook(unraisable: Any) -> None:
        value = unraisable.exc_value
        if not (isinstance(value, RuntimeError) and str(value) == "Event loop is closed"):
            hook(unraisable)

    logger.addFilter(orbax_filter)
    sys.unraisablehook = unraisablehook
    try:
        yield
    finally:
        sys.unraisablehook = hook
        logger.removeFilter(orbax_filter)


def where_saved(workdir: str) -> str:
    """The line naming what a run keeps in ``workdir``."""
    from transformer_jax.training.checkpoints import CHECKPOINT_DIR, CONFIG_FILE
    from transformer_jax.training.logs import METRICS_FILE

    kept = (CHECKPOINT_DIR, CONFIG_FILE, METRICS_FILE)
    return f"workdir: {os.path.abspath(workdir)} ({', '.join(kept)})"


def _train(values: flags.FlagValues, positional: list[str]) -> int:
    """Train and evaluate the run of the parsed flags; the exit code of how it ended."""
    import jax

    from transformer_jax.compilation_cache import use_cache_flags
    from transformer_jax.kernels import configure_process
    from transformer_jax.multihost import distributed, peers

    config, workdir = config_and_workdir(values, positional)
    logging.set_verbosity(logging.WARNING)  # Orbax logs every file it writes at INFO
    multihost = False
    try:
        configure_process(config.model.platform)  # CPU runtime settings; before JAX starts
        use_cache_flags(values)
        multihost = distributed.initialize(
            values.multihost,
            values.initialization_timeout,
            values.peer_timeout,
            coordinator_address=values.coordinator_address,
            num_processes=values.num_processes,
            process_id=values.process_id,
        )
        if multihost:
            peers.agree(config.to_dict(), values.num_processes, values.initialization_timeout)
            stop_watching = peers.watch(values.peer_timeout)
        result = _run(config, workdir)
    except (ValueError, FloatingPointError, OSError, RuntimeError) as e:
        if multihost:  # its peers may be lost: no waiting for them on the way out
            distributed.end(peers.describe(e))
        if isinstance(e, RuntimeError):
            raise
        raise Failure(str(e)) from None
    except KeyboardInterrupt:
        message = "interrupted (a second Ctrl-C): the last checkpoint is kept"
        if jax.distributed.is_initialized():  # no waiting for the peers at JAX's shutdown
            distributed.end(message, EXIT_INTERRUPTED)
        raise Failure(message, EXIT_INTERRUPTED) from None
    if multihost:
        stop_watching()
        distributed.finish()
    if not result["complete"]:
        return _STOPPED[result["stopped_by"]]
    return 0


def _run(config: RunConfig, workdir: str) -> dict[str, Any]:
    """train_and_evaluate, the workdir named before and after (by process 0)."""
    import jax

    from transformer_jax.training.loop import train_and_evaluate

    first = jax.process_index() == 0
    if first:
        print(f"workdir: {os.path.abspath(workdir)}", flush=True)
    with quiet_orbax():
        # Once training stops the run is saved: a late SIGTERM (a launcher signals each task,
        # steps apart) must not kill this process while it shuts down, its peers waiting.
        result = train_and_evaluate(config, workdir, sigterm_after=signal.SIG_IGN)
    if first:
        print(where_saved(workdir), flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """``python train.py`` / ``transformer-jax train``: train with the command line ``argv``
    (default ``sys.argv[1:]``); the exit code."""
    exit_on_sigterm()  # until the loop's own handler
    return run(__doc__, define_flags, _train, argv, "train.py")


if __name__ == "__main__":
    sys.exit(main())
