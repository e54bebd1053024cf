"""`python train.py`: see :mod:`transformer_jax.cli.train` (``python train.py --help``)."""

import os
import signal
import sys

# Preempted while the libraries load: the exit code of a preempted run (cli.train's EXIT_PREEMPTED)
signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(75))

from transformer_jax.cli.train import main  # noqa: E402 - after the handler

if __name__ == "__main__":
    sys.exit(main())
