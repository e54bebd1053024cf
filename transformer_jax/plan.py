"""`python -m transformer_jax.plan`: the plan command where the console script is not on
PATH (:mod:`transformer_jax.cli.plan`)."""

import sys

from transformer_jax.cli.plan import main

if __name__ == "__main__":
    sys.exit(main())
