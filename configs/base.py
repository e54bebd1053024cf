"""The paper's base model on WMT14 English->German (Table 3, "base")."""

from transformer_jax.training.defaults import default_config


def get_config():
    return default_config()
