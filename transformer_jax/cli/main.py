"""The ``transformer-jax`` console script: ``transformer-jax COMMAND [FLAGS]``.

Runs the command's ``main`` (``transformer-jax train --config base`` is
``python train.py --config base``); ``transformer-jax COMMAND --help`` shows its flags.
Every command parses its flags and exits the same way (:mod:`transformer_jax.cli.flags`).
A command's module is imported once it is the one named: the usage and an unknown command
import no library.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

# command -> what it does, for the usage; its module transformer_jax.cli.<command> has the
# main(argv) that runs it and returns its exit code
COMMANDS: dict[str, str] = {
    "train": "train and evaluate a run (python train.py); rerun to resume",
    "translate": "translate sentences with a trained run (beam search)",
    "evaluate": "translate a test set and score it with BLEU",
    "average": "average a run's last checkpoints (paper §6.1)",
    "download": "download a data set (Multi30k) for the text source",
    "prepare": "tokenize and binarize a run's data splits (train.py does it if absent)",
    "plan": "compile a run's GPU programs without a GPU: memory, batch, step time",
}
PROG = "transformer-jax"


def command(name: str) -> ModuleType:
    """The module of the command ``name``, imported now."""
    return importlib.import_module(f"transformer_jax.cli.{name}")


def usage() -> str:
    lines = [f"usage: {PROG} COMMAND [FLAGS]   ({PROG} COMMAND --help: its flags)", ""]
    lines += [f"  {name:<10} {what}" for name, what in COMMANDS.items()]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``argv[0]``'s command with the rest of ``argv`` (default ``sys.argv[1:]``) as its
    command line; returns the command's exit status (0 for a ``--help``, 2 for no command)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, *rest = argv
    if name not in COMMANDS:
        print(f"{PROG}: unknown command {name!r}\n\n{usage()}", end="", file=sys.stderr)
        return 2
    return command(name).main(rest)


if __name__ == "__main__":
    sys.exit(main())
