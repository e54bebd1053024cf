"""Prepare a run's data before training it:

    transformer-jax prepare --config base --workdir runs/base
    transformer-jax prepare --config base --data_dir /shared/wmt14 --workers 32

(``python -m transformer_jax.data.prepare`` is the same command.) It trains the tokenizer
(``{workdir}/tokenizer.model``) if absent and encodes the training, dev and test splits into
the prepared (binarized) splits that ``train.py`` maps: in ``{workdir}/data_cache``, or in
``--data_dir`` (the same as ``--config.data.data_dir``; give ``train.py`` the same value).
``--workers`` processes encode (``data.prepare_workers``; default one per core), with the
same files for any number. A progress bar shows each split; rerun after an interruption to
resume from the chunks already written. A prepared split that fails its checksums is
prepared anew (a warning line names the file), the tokenizer and the other splits kept.
``train.py`` prepares what is missing itself (on process 0) and refuses a damaged split in
one line that names this command; this command prepares once before the hosts of a cluster
start. Any config field can be overridden with ``--config.<section>.<field>=value``.

Exit codes: 0 prepared (or already prepared); 1 an error, printed as one line; 2 a bad
command line; 75 stopped by SIGTERM and 130 by Ctrl-C (rerun to resume).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from types import FrameType

from absl import flags

from transformer_jax.cli.flags import (
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    Failure,
    config_and_workdir,
    define_config_flag,
    run,
)

RESUME = "rerun to resume from the chunks already written"


def define_flags(values: flags.FlagValues, argv: list[str]) -> None:
    define_config_flag(values, argv)
    define = {"flag_values": values}
    flags.DEFINE_string("workdir", None, "The run's folder (default runs/<config name>).", **define)
    flags.DEFINE_string("data_dir", None, "Where to prepare the splits (data.data_dir).", **define)
    flags.DEFINE_integer(
        "workers", None, "Processes that encode (data.prepare_workers; 0: one per core).", **define
    )


def _stopped(signum: int, frame: FrameType | None) -> None:
    raise Failure(f"stopped by SIGTERM: {RESUME}", EXIT_PREEMPTED)


def _prepare(values: flags.FlagValues, positional: list[str]) -> None:
    from transformer_jax.data.preparation import prepare_run_data, run_splits
    from transformer_jax.training.validation import validate_config

    flagged = {"data_dir": values.data_dir, "prepare_workers": values.workers}
    data = {name: value for name, value in flagged.items() if value is not None}
    config, workdir = config_and_workdir(values, positional, data=data)
    model_config = validate_config(config)  # before anything is written
    splits = run_splits(config.data, config.train.final_test)
    previous = signal.signal(signal.SIGTERM, _stopped)  # the workers stopped, then one line
    try:
        paths = prepare_run_data(
            config.data, workdir, config.model.vocab_size, model_config.tgt_vocab, splits
        )
    except KeyboardInterrupt:
        raise Failure(f"interrupted: {RESUME}", EXIT_INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("prepared:", *paths, sep="\n  ", file=sys.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    """``transformer-jax prepare``: prepare with the command line ``argv``; the exit code."""
    return run(__doc__, define_flags, _prepare, argv, "transformer-jax prepare")


if __name__ == "__main__":
    sys.exit(main())
