"""`python -m transformer_jax.data.prepare`: see :mod:`transformer_jax.cli.prepare`."""

import sys

from transformer_jax.cli.prepare import main

if __name__ == "__main__":
    sys.exit(main())
