"""The packages' lazy attributes: a package's module imported when first named as an attribute
(``transformer_jax.data.batching``), so that importing a package imports none of its modules."""

from __future__ import annotations

import importlib
from types import ModuleType


def submodule(package: str, name: str) -> ModuleType:
    """The module ``package.name``, imported now; AttributeError (a module ``__getattr__``'s
    answer) where the package has no such module."""
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{package}.{name}":
            raise  # the module exists and one of its imports is missing
        raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
