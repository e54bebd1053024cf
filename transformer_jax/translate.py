"""`python -m transformer_jax.translate`: the translate command where the console script is not on
PATH (:mod:`transformer_jax.cli.translate`)."""

import sys

from transformer_jax.cli.translate import main

if __name__ == "__main__":
    sys.exit(main())
