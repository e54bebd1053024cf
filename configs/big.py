"""``--config configs/big.py`` is ``--config big``: the package's config, re-exported."""

from transformer_jax.configs.big import get_config

__all__ = ["get_config"]
