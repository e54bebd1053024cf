"""``--config configs/multi30k.py`` is ``--config multi30k``: the package's config, re-exported."""

from transformer_jax.configs.multi30k import get_config

__all__ = ["get_config"]
