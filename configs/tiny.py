"""``--config configs/tiny.py`` is ``--config tiny``: the package's config, re-exported."""

from transformer_jax.configs.tiny import get_config

__all__ = ["get_config"]
