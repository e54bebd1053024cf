"""`python -m transformer_jax.train`: the train command where the console script is not on
PATH (:mod:`transformer_jax.cli.train`)."""

import sys

from transformer_jax.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
