"""`python train.py`: see :mod:`transformer_jax.cli.train` (``python train.py --help``)."""

from transformer_jax.cli.train import main

if __name__ == "__main__":
    main()
