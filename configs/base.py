"""``--config configs/base.py`` is ``--config base``: the package's config, re-exported."""

from transformer_jax.configs.base import get_config

__all__ = ["get_config"]
