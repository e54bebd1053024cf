"""`python -m transformer_jax.download`: the download command where the console script is not on
PATH (:mod:`transformer_jax.cli.download`)."""

import sys

from transformer_jax.cli.download import main

if __name__ == "__main__":
    sys.exit(main())
