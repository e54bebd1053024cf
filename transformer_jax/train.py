"""`python -m transformer_jax.train`: see :mod:`transformer_jax.cli.train`."""

import sys

from transformer_jax.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
