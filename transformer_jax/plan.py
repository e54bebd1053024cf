"""`python -m transformer_jax.plan`: see :mod:`transformer_jax.cli.plan`."""

import sys

from transformer_jax.cli.plan import main

if __name__ == "__main__":
    sys.exit(main())
