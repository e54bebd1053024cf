"""`python -m transformer_jax.download`: see :mod:`transformer_jax.cli.download`."""

import sys

from transformer_jax.cli.download import main

if __name__ == "__main__":
    sys.exit(main())
