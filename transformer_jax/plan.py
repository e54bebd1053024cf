"""`python -m transformer_jax.plan`: see :mod:`transformer_jax.cli.plan`."""

from transformer_jax.cli.plan import main

if __name__ == "__main__":
    main()
