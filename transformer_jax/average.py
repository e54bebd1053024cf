"""`python -m transformer_jax.average`: the average command where the console script is not on
PATH (:mod:`transformer_jax.cli.average`)."""

import sys

from transformer_jax.cli.average import main

if __name__ == "__main__":
    sys.exit(main())
