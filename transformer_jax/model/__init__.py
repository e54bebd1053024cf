"""The encoder-decoder of the paper (§3): config, attention, embeddings, layers, the model.

Each module is imported when first named (a module ``__getattr__``): importing the package,
its ``config`` or its ``registry`` imports neither JAX nor Flax. A ``TransformerConfig``
accepts the library's pieces' names (:data:`transformer_jax.model.registry.SHIPPED`) wherever
it is made; the modules that hold them are imported once a config is made.
"""

from __future__ import annotations

from types import ModuleType

from transformer_jax.lazy import submodule


def __getattr__(name: str) -> ModuleType:
    """A module of the model, imported on first use."""
    return submodule(__name__, name)
