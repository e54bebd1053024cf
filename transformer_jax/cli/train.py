"""Train a Transformer: ``python train.py`` trains configs/tiny.py on the embedded data.

    python train.py --config configs/base.py --workdir runs/base
    python train.py --config configs/tiny.py --config.train.num_steps=500

(``python -m transformer_jax.train`` is the same command.) Any config field can be
overridden with ``--config.<section>.<field>=value``; the workdir defaults to
``runs/<config file name>``. Rerunning resumes from the last checkpoint. ``--multihost``
starts one process of a run over several hosts (README, Multi-host):
``--coordinator_address``, ``--num_processes`` and ``--process_id``, or what SLURM, Open MPI
or Kubernetes tell JAX; each process trains on its share of every batch. The config fields
and their defaults are in ``configs/tiny.py`` and ``transformer_jax/training/defaults.py``;
a run's resolved config is ``{workdir}/config.json``.

Exit codes: 0 trained and evaluated (or already complete); 1 an error, printed as one line
(a bad config value or file, data, a non-finite loss, a full disk); 2 a bad command line;
75 stopped by SIGTERM (preempted) after saving a checkpoint: rerun to resume; 130 stopped by
Ctrl-C (SIGINT; saved like SIGTERM, a second Ctrl-C stops at once). A SIGTERM after the last
step lets the final evaluation finish (exit 0); once the run is saved, further SIGTERMs are
ignored while the process exits.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, NoReturn

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from transformer_jax.kernels import configure_process
from transformer_jax.training import distributed
from transformer_jax.training.loop import train_and_evaluate

EXIT_ERROR, EXIT_USAGE, EXIT_PREEMPTED, EXIT_INTERRUPTED = 1, 2, 75, 130
_STOPPED = {"SIGTERM": EXIT_PREEMPTED, "SIGINT": EXIT_INTERRUPTED}
# The repository's configs/, next to train.py (the package is installed editable).
DEFAULT_CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "configs",
    "tiny.py",
)
_HELP = {"-h", "--help", "--helpshort", "--helpfull", "-?"}
FLAGS = flags.FLAGS


def _fail(message: str, code: int) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def _config_error(error: Exception) -> NoReturn:
    """One line for a config file or override that cannot be loaded or applied."""
    while error.args and isinstance(error.args[0], Exception):  # AttributeError(KeyError(...))
        error = error.args[0]
    text = error.args[0] if error.args and isinstance(error.args[0], str) else str(error)
    lines = "; ".join(line.strip() for line in text.splitlines() if line.strip())
    unknown = isinstance(error, KeyError | AttributeError)
    _fail(f"{'unknown config field' if unknown else 'bad --config'}: {lines}", EXIT_USAGE)


def _define_flags() -> None:
    """The command's flags, defined when it runs (importing this module defines none)."""
    try:  # loads the default config file
        config_flags.DEFINE_config_file(
            "config",
            DEFAULT_CONFIG,
            "Run configuration file; override any field with --config.SECTION.FIELD=VALUE.",
        )
    except (KeyError, AttributeError, TypeError, ValueError) as e:
        _config_error(e)
    flags.DEFINE_string("workdir", None, "Output directory (default runs/<config name>).")
    flags.DEFINE_bool(
        "multihost", False, "One process of a run over several processes (jax.distributed)."
    )
    flags.DEFINE_string(
        "coordinator_address", None, "host:port of process 0 (implies --multihost)."
    )
    flags.DEFINE_integer("num_processes", None, "Processes in the run (implies --multihost).")
    flags.DEFINE_integer(
        "process_id", None, "This process's index, 0 to num_processes - 1 (implies --multihost)."
    )


def _usage(full: bool) -> NoReturn:
    """This docstring and the command's flags (all of absl's with ``--helpfull``); exit 0."""
    module = FLAGS.find_module_defining_flag("workdir")
    help_text = FLAGS.get_help() if full else FLAGS.module_help(module)
    print(f"{__doc__}\nflags:\n{help_text}")
    sys.exit(0)


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with help that exits 0 and one line for a bad flag or config."""
    if _HELP & set(argv[1:]):
        _usage(full="--helpfull" in argv)
    try:
        return FLAGS(argv)
    except flags.Error as e:
        text = str(e).strip()
        if "Traceback" in text:  # the config file's get_config raised: its last line says why
            _fail(f"bad --config: {text.splitlines()[-1]}", EXIT_USAGE)
        _fail(text, EXIT_USAGE)
    except (KeyError, AttributeError, TypeError, ValueError) as e:
        _config_error(e)
    except SyntaxError as e:
        _fail(f"--config file {e.filename}, line {e.lineno}: {e.msg}", EXIT_USAGE)


def _quiet_orbax() -> None:
    """Leave a failed save to the loop's one line: Orbax logs it from each writer thread, and
    asyncio prints "Event loop is closed" once per write still pending."""
    logging.get_absl_handler().addFilter(lambda record: "orbax" not in record.pathname)
    default = sys.unraisablehook

    def unraisablehook(unraisable: Any) -> None:
        value = unraisable.exc_value
        if not (isinstance(value, RuntimeError) and str(value) == "Event loop is closed"):
            default(unraisable)

    sys.unraisablehook = unraisablehook


def _load_config() -> ml_collections.ConfigDict:
    """The config of ``--config`` with its overrides; one line and exit 2 if it fails."""
    config_file = FLAGS["config"].config_filename.partition(":")[0]
    if not os.path.isfile(config_file):
        _fail(f"--config file {config_file!r} does not exist", EXIT_USAGE)
    try:
        config = FLAGS.config
        config.get("train")  # a config file that failed to load fails here
    except (OSError, KeyError, AttributeError, TypeError, ValueError) as e:
        _config_error(e)
    return config


def config_and_workdir(argv: list[str]) -> tuple[ml_collections.ConfigDict, str]:
    """The config and workdir of the parsed flags (``--workdir``, else runs/<config name>)."""
    if len(argv) > 1:
        _fail(f"unexpected arguments: {argv[1:]}", EXIT_USAGE)
    config = _load_config()
    name = os.path.splitext(os.path.basename(FLAGS["config"].config_filename))[0]
    return config, FLAGS.workdir or os.path.join("runs", name)


def _train(argv: list[str]) -> None:
    """Train and evaluate the run of the parsed flags; exit with the code of how it ended."""
    config, workdir = config_and_workdir(argv)
    logging.set_verbosity(logging.WARNING)  # Orbax logs every file it writes at INFO
    _quiet_orbax()
    configure_process(config.model.platform)  # CPU runtime settings; before JAX starts
    try:
        distributed.initialize(
            FLAGS.multihost,
            coordinator_address=FLAGS.coordinator_address,
            num_processes=FLAGS.num_processes,
            process_id=FLAGS.process_id,
        )
        # Once training stops the run is saved: a late SIGTERM (a launcher signals each task,
        # steps apart) must not kill this process while it shuts down, its peers waiting.
        result = train_and_evaluate(config, workdir, sigterm_after=signal.SIG_IGN)
    except (ValueError, FloatingPointError, OSError) as e:
        _fail(str(e), EXIT_ERROR)
    except KeyboardInterrupt:
        _fail("interrupted (a second Ctrl-C): the last checkpoint is kept", EXIT_INTERRUPTED)
    if not result["complete"]:
        sys.exit(_STOPPED[result["stopped_by"]])


def main() -> None:
    """``python train.py`` / ``python -m transformer_jax.train``: parse sys.argv, train, exit."""
    _define_flags()
    app.run(_train, flags_parser=_parse_flags)


if __name__ == "__main__":
    main()
