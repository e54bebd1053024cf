"""`python -m transformer_jax.translate`: see :mod:`transformer_jax.cli.translate`."""

import sys

from transformer_jax.cli.translate import main

if __name__ == "__main__":
    sys.exit(main())
