"""Checkpoint averaging (paper §6.1: "averaging the last 5 checkpoints, which were written
at 10-minute intervals" for the base model, the last 20 for the big one).

    transformer-jax average --workdir DIR --last N

writes the element-wise mean of the parameters of the last N checkpoints to
``{workdir}/averaged`` (tagged with the newest step), which ``translate`` and
``evaluate`` load with ``--checkpoint averaged``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from absl import flags

from transformer_jax.cli.flags import no_arguments, run


def define_flags(values: flags.FlagValues, argv: list[str]) -> None:
    flags.DEFINE_string("workdir", None, "Training run directory.", flag_values=values)
    flags.mark_flag_as_required("workdir", flag_values=values)
    flags.DEFINE_integer(
        "last",
        5,
        "Checkpoints to average (paper: 5 base, 20 big).",
        lower_bound=1,
        flag_values=values,
    )


def _average(values: flags.FlagValues, positional: list[str]) -> None:
    from transformer_jax.training.averaging import average_checkpoints

    no_arguments(positional)
    steps, directory = average_checkpoints(values.workdir, values.last)
    print(f"averaged the parameters of steps {steps} into {directory}")


def main(argv: Sequence[str] | None = None) -> int:
    """``transformer-jax average``: average with the command line ``argv``; the exit code."""
    return run(__doc__, define_flags, _average, argv, "transformer-jax average")


if __name__ == "__main__":
    sys.exit(main())
