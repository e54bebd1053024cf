"""`python -m transformer_jax.train`: see :mod:`transformer_jax.cli.train`."""

from transformer_jax.cli.train import main

if __name__ == "__main__":
    main()
