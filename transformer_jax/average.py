"""`python -m transformer_jax.average`: see :mod:`transformer_jax.cli.average`."""

import sys

from transformer_jax.cli.average import main

if __name__ == "__main__":
    sys.exit(main())
