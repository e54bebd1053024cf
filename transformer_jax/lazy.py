"""The packages' lazy attributes: a package's module imported when first named as an attribute
(``transformer_jax.data.batching``), so that importing a package imports none of its modules."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any


def submodule(package: str, name: str) -> ModuleType:
    """The module ``package.name``, imported now; AttributeError (a module ``__getattr__``'s
    answer) where the package has no such module."""
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{package}.{name}":
            raise  # the module exists and one of its imports is missing
        raise AttributeError(f"module {package!r} has no attribute {name!r}") from None


def lazy_names(
    package: str, public: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``: a name of ``public`` (name ->
    the package's module that defines it) taken from its module when first used and kept,
    any other name a module of the package (:func:`submodule`)."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name not in public:
            return submodule(package, name)
        value = getattr(importlib.import_module(f"{package}.{public[name]}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *public})

    return __getattr__, __dir__
