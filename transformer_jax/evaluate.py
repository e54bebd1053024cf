"""`python -m transformer_jax.evaluate`: the evaluate command where the console script is not on
PATH (:mod:`transformer_jax.cli.evaluate`)."""

import sys

from transformer_jax.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
