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
each other before every one stops with one line. The config fields and their defaults are
in ``transformer_jax/configs/tiny.py`` and ``training/defaults.py``;
a run's resolved config is ``{workdir}/config.json``.

Exit codes: 0 trained and evaluated (or already complete); 1 an error, printed as one line
(a bad config value or file, data, a non-finite loss, a full disk); 2 a bad command line;
75 stopped by
SIGTERM (preempted, at any point; once training started, after saving a checkpoint): rerun
to resume; 130 stopped by Ctrl-C (SIGINT; saved like SIGTERM, a second Ctrl-C stops at
once). A SIGTERM after the last step lets the final evaluation finish (exit 0); once the
run is saved, further SIGTERMs are ignored while the process exits.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import jax
import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from transformer_jax.configs import NAMES, config_file
from transformer_jax.kernels import configure_process
from transformer_jax.preemption import EXIT_PREEMPTED, exit_on_sigterm
from transformer_jax.training import distributed, peers
from transformer_jax.training.loop import train_and_evaluate

EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
_STOPPED = {"SIGTERM": EXIT_PREEMPTED, "SIGINT": EXIT_INTERRUPTED}
DEFAULT_CONFIG = config_file("tiny")
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


def define_config_flag() -> None:
    """``--config``: a packaged config's name or a config file, with its overrides."""
    try:  # loads the default config file
        config_flags.DEFINE_config_file(
            "config",
            DEFAULT_CONFIG,
            f"Run configuration: a name ({', '.join(NAMES)}) or a config file; override any "
            "field with --config.SECTION.FIELD=VALUE.",
        )
    except (KeyError, AttributeError, TypeError, ValueError) as e:
        _config_error(e)
    FLAGS["config"].parser = _NamedConfigParser(FLAGS["config"].parser)


def _define_flags() -> None:
    """The command's flags, defined when it runs (importing this module defines none)."""
    define_config_flag()
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
    flags.DEFINE_float(
        "initialization_timeout",
        30,
        "Seconds for every process of a multi-host run to connect and agree on its launch.",
        lower_bound=1,
    )
    flags.DEFINE_float(
        "peer_timeout",
        30,
        "Seconds a process of a multi-host run may go unheard before every process stops.",
        lower_bound=1,
    )


class _NamedConfigParser(flags.ArgumentParser):
    """ml_collections' config file parser, also given a packaged config's name."""

    def __init__(self, files: flags.ArgumentParser):
        self.files = files

    def parse(self, argument: str) -> ml_collections.ConfigDict:
        return self.files.parse(config_file(argument))

    def flag_type(self) -> str:
        return self.files.flag_type()


def _usage(doc: str, own_flag: str, full: bool) -> NoReturn:
    """``doc`` and the command's flags (all of absl's with ``--helpfull``); exit 0."""
    modules = dict.fromkeys(FLAGS.find_module_defining_flag(n) for n in ("config", own_flag))
    help_text = FLAGS.get_help() if full else "\n".join(map(FLAGS.module_help, modules))
    print(f"{doc}\nflags:\n{help_text}")
    sys.exit(0)


def flags_parser(doc: str, own_flag: str) -> Callable[[list[str]], list[str]]:
    """absl's parsing for a command (``doc`` and its flags for ``--help``, ``own_flag`` one
    it defines), with help that exits 0 and one line for a bad flag or config."""

    def parse(argv: list[str]) -> list[str]:
        if _HELP & set(argv[1:]):
            _usage(doc, own_flag, full="--helpfull" in argv)
        try:
            return FLAGS(argv)
        except flags.Error as e:
            text = str(e).strip()
            if "Traceback" in text:  # the config file's get_config raised: its last line says
                _fail(f"bad --config: {text.splitlines()[-1]}", EXIT_USAGE)
            _fail(text, EXIT_USAGE)
        except (OSError, KeyError, AttributeError, TypeError, ValueError) as e:
            _config_error(e)  # OSError: a --config file that does not exist, with overrides
        except SyntaxError as e:
            _fail(f"--config file {e.filename}, line {e.lineno}: {e.msg}", EXIT_USAGE)

    return parse


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


def _config_path() -> str:
    """The file of ``--config``, without its ``:ARGS``."""
    return config_file(FLAGS["config"].config_filename).partition(":")[0]


def _load_config() -> ml_collections.ConfigDict:
    """The config of ``--config`` with its overrides; one line and exit 2 if it fails."""
    path = _config_path()
    if not os.path.isfile(path):
        _fail(f"--config file {path!r} does not exist (names: {', '.join(NAMES)})", EXIT_USAGE)
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
    name = os.path.splitext(os.path.basename(_config_path()))[0]
    return config, FLAGS.workdir or os.path.join("runs", name)


def _train(argv: list[str]) -> None:
    """Train and evaluate the run of the parsed flags; exit with the code of how it ended."""
    config, workdir = config_and_workdir(argv)
    logging.set_verbosity(logging.WARNING)  # Orbax logs every file it writes at INFO
    _quiet_orbax()
    multihost = False
    try:
        configure_process(config.model.platform)  # CPU runtime settings; before JAX starts
        multihost = distributed.initialize(
            FLAGS.multihost,
            FLAGS.initialization_timeout,
            FLAGS.peer_timeout,
            coordinator_address=FLAGS.coordinator_address,
            num_processes=FLAGS.num_processes,
            process_id=FLAGS.process_id,
        )
        if multihost:
            peers.agree(config, FLAGS.num_processes, FLAGS.initialization_timeout)
            stop_watching = peers.watch(FLAGS.peer_timeout)
        # Once training stops the run is saved: a late SIGTERM (a launcher signals each task,
        # steps apart) must not kill this process while it shuts down, its peers waiting.
        result = train_and_evaluate(config, workdir, sigterm_after=signal.SIG_IGN)
    except (ValueError, FloatingPointError, OSError, RuntimeError) as e:
        if multihost:  # its peers may be lost: no waiting for them on the way out
            distributed.end(peers.describe(e))
        if isinstance(e, RuntimeError):
            raise
        _fail(str(e), EXIT_ERROR)
    except KeyboardInterrupt:
        message = "interrupted (a second Ctrl-C): the last checkpoint is kept"
        if jax.distributed.is_initialized():  # no waiting for the peers at JAX's shutdown
            distributed.end(message, EXIT_INTERRUPTED)
        _fail(message, EXIT_INTERRUPTED)
    if multihost:
        stop_watching()
        distributed.finish()
    if not result["complete"]:
        sys.exit(_STOPPED[result["stopped_by"]])


def main() -> None:
    """``python train.py`` / ``python -m transformer_jax.train``: parse sys.argv, train, exit."""
    exit_on_sigterm()  # until the loop's own handler
    _define_flags()
    app.run(_train, flags_parser=flags_parser(__doc__, "workdir"))


if __name__ == "__main__":
    main()
