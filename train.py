"""`python train.py`: see :mod:`transformer_jax.cli.train` (``python train.py --help``)."""

import sys

from transformer_jax.multihost.preemption import exit_on_sigterm

exit_on_sigterm()  # preempted while the libraries load: exit 75 with one line

from transformer_jax.cli.train import main  # noqa: E402 - after the handler

if __name__ == "__main__":
    sys.exit(main())
