"""The commands' one command-line convention: absl flags, one error line, one set of exit codes.

Every command parses its command line with absl's flags. absl, not argparse, because
``train``, ``prepare`` and ``plan`` take a run config with ``--config.SECTION.FIELD=VALUE``
overrides, which ml_collections' ``config_flags`` (an absl flag) parses and checks against
the config's field types; argparse would need the project to parse them again. Each call of a
command defines its flags in a new ``FlagValues`` (not absl's global ``FLAGS``): ``--help``
lists that command's flags only, importing a command defines nothing, and a command runs
twice in one process with nothing left from the first run.

A command parses its command line before it imports the library it runs (inside the
function that runs it): ``--help``, a rejected flag and a config field that its check refuses
(:func:`transformer_jax.training.schema.check_fields`) import no JAX; nor does loading a run
config (its schema and sections import none).

Exit codes, the same in every command (README, Exit codes):

- 0: done;
- 1: an error the command reports in one line ``error: ...``: a file or workdir that is
  missing or damaged, a config value or ``--config`` file that is wrong, bad data;
- 2: a command line absl rejects, in one line: an unknown flag or config field, a value not
  of its flag's type or outside its bounds, a required flag missing, an extra argument;
- 75: stopped by SIGTERM (train: preempted; rerun to resume);
- 130: stopped by Ctrl-C (train: saved like SIGTERM).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence

import ml_collections
from absl import flags
from ml_collections import config_flags

from transformer_jax.configs import NAMES, config_file
from transformer_jax.multihost.preemption import EXIT_PREEMPTED  # noqa: F401 (one of the exit codes)
from transformer_jax.training import schema

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
HELP = ("-h", "--help", "--helpshort", "--helpfull", "-?")
DEFAULT_CONFIG = config_file("tiny")

# A command's flags: defined into the FlagValues given, from the command line given (the
# config flag reads its overrides from it).
Define = Callable[[flags.FlagValues, list[str]], None]


class Failure(Exception):
    """A failure the command reports as ``error: MESSAGE`` and exits ``code`` with."""

    def __init__(self, message: str, code: int = EXIT_ERROR):
        super().__init__(message)
        self.code = code


def usage_error(message: str) -> Failure:
    return Failure(message, EXIT_USAGE)


def run(
    doc: str,
    define: Define,
    body: Callable[[flags.FlagValues, list[str]], int | None],
    argv: Sequence[str] | None,
    prog: str,
) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) with the flags of ``define`` and run
    ``body(flag values, positional arguments)``; its exit code (module docstring).

    ``--help`` prints ``doc`` as written and the command's flags. A command with ``--config``
    checks its config's fields first. A :class:`Failure`, a ``ValueError`` or an ``OSError``
    is one line ``error: ...`` on stderr.
    """
    argv = [prog, *(sys.argv[1:] if argv is None else argv)]
    try:
        values = flags.FlagValues()
        define(values, argv)
        if any(arg in HELP for arg in argv[1:]):
            fields = f"\n\n{schema.help_text()}" if "config" in values else ""
            print(f"{doc.rstrip()}\n\nflags:\n{flags_help(values)}{fields}")
            return EXIT_OK
        positional = _parse(values, argv)[1:]
        if "config" in values:
            schema.check_fields(load_config(values))  # before the command imports the library
        return body(values, positional) or EXIT_OK
    except Failure as e:
        return _error(str(e), e.code)
    except (ValueError, OSError) as e:
        return _error(str(e), EXIT_ERROR)


def _error(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def flags_help(values: flags.FlagValues) -> str:
    """The help of the command's flags (absl's own, --flagfile and --undefok, left out)."""
    modules = [m for m in values.flags_by_module_dict() if m != "absl.flags"]
    helps = (values.module_help(m).split("\n", 2)[-1] for m in modules)  # less "\nmodule:"
    return "\n".join(helps)


def _parse(values: flags.FlagValues, argv: list[str]) -> list[str]:
    """absl's parse of ``argv``, its errors as :class:`Failure`: a bad command line exits 2,
    a config file that cannot be loaded or applied 1, both in one line."""
    if not flags.FLAGS.is_parsed():  # libraries that read absl's global flags (logging)
        flags.FLAGS.mark_as_parsed()
    try:
        return values(argv)
    except flags.Error as e:
        text = str(e).strip()
        if "Traceback" in text:  # the config file's get_config raised: its last line says
            raise Failure(f"bad --config: {text.splitlines()[-1]}") from None
        if required := re.search(r"Flag (--\w+) must have a value other than None", text):
            text = f"{required[1]} is required"
        raise usage_error(text) from None
    except (OSError, KeyError, AttributeError, TypeError, ValueError) as e:
        raise config_error(e) from None  # OSError: a missing --config file with overrides
    except SyntaxError as e:
        raise Failure(f"--config file {e.filename}, line {e.lineno}: {e.msg}") from None


def config_error(error: Exception) -> Failure:
    """One line for a config file or override that cannot be loaded or applied: an unknown
    field is a usage error, the rest a config error."""
    while error.args and isinstance(error.args[0], Exception):  # AttributeError(KeyError(...))
        error = error.args[0]
    text = error.args[0] if error.args and isinstance(error.args[0], str) else str(error)
    lines = "; ".join(line.strip() for line in text.splitlines() if line.strip())
    if isinstance(error, KeyError | AttributeError):
        return usage_error(f"unknown config field: {lines}")
    return Failure(f"bad --config: {lines}")


class _NamedConfigParser(flags.ArgumentParser):
    """ml_collections' config file parser, also given a packaged config's name."""

    def __init__(self, files: flags.ArgumentParser):
        self.files = files

    def parse(self, argument: str) -> ml_collections.ConfigDict:
        return self.files.parse(config_file(argument))

    def flag_type(self) -> str:
        return self.files.flag_type()


def define_config_flag(values: flags.FlagValues, argv: list[str]) -> None:
    """``--config``: a packaged config's name or a config file, with the overrides
    ``--config.SECTION.FIELD=VALUE`` of ``argv``."""
    try:  # loads the default config file
        config_flags.DEFINE_config_file(
            "config",
            DEFAULT_CONFIG,
            f"Run configuration: a name ({', '.join(NAMES)}) or a config file; override any "
            "field with --config.SECTION.FIELD=VALUE.",
            flag_values=values,
            sys_argv=argv,
        )
    except (KeyError, AttributeError, TypeError, ValueError) as e:
        raise config_error(e) from None
    values["config"].parser = _NamedConfigParser(values["config"].parser)


def define_cache_flags(values: flags.FlagValues) -> None:
    """``--[no]compilation_cache`` and ``--compilation_cache_dir``
    (:mod:`transformer_jax.compilation_cache`)."""
    define = {"flag_values": values}
    flags.DEFINE_bool(
        "compilation_cache",
        True,
        "Keep compiled programs on disk, so that the next start of the same run loads them.",
        **define,
    )
    flags.DEFINE_string(
        "compilation_cache_dir",
        None,
        "The compilation cache's folder (default: $JAX_COMPILATION_CACHE_DIR, else "
        "$XDG_CACHE_HOME/transformer_jax/xla, else ~/.cache/transformer_jax/xla).",
        **define,
    )


def config_path(values: flags.FlagValues) -> str:
    """The file of ``--config``, without its ``:ARGS``."""
    return config_file(values["config"].config_filename).partition(":")[0]


def load_config(values: flags.FlagValues) -> ml_collections.ConfigDict:
    """The config of ``--config`` with its overrides; :class:`Failure` if it fails."""
    path = config_path(values)
    if not os.path.isfile(path):
        raise Failure(f"--config file {path!r} does not exist (names: {', '.join(NAMES)})")
    try:
        config = values.config
        config.get("train")  # a config file that failed to load fails here
    except (OSError, KeyError, AttributeError, TypeError, ValueError) as e:
        raise config_error(e) from None
    return config


def run_config(values: flags.FlagValues, **changes: dict) -> schema.RunConfig:
    """The run config of ``--config`` with its overrides and ``changes`` (``{section:
    {field: value}}``), checked (:class:`transformer_jax.training.schema.RunConfig`): what
    the command passes to the library."""
    config = load_config(values).to_dict()
    for section, fields in changes.items():
        config[section] |= fields
    return schema.RunConfig.from_config(config)


def config_and_workdir(
    values: flags.FlagValues, positional: list[str], **changes: dict
) -> tuple[schema.RunConfig, str]:
    """The run config (:func:`run_config`) and workdir of the parsed flags (``--workdir``,
    else runs/<config name>)."""
    no_arguments(positional)
    config = run_config(values, **changes)
    name = os.path.splitext(os.path.basename(config_path(values)))[0]
    return config, values.workdir or os.path.join("runs", name)


def no_arguments(positional: list[str]) -> None:
    if positional:
        raise usage_error(f"unexpected arguments: {positional}")
