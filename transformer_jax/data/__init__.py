"""Data: shared BPE tokenizer, streamed parallel-text sources, prepared (memory-mapped)
splits, token-budget batches (paper §5.1).

Each name is imported when first used (a module ``__getattr__``): importing the package,
its ``config`` or its ``sources`` imports no JAX.
"""

from __future__ import annotations

import importlib
from typing import Any

from transformer_jax.lazy import submodule

# name -> the module of this package that defines it
_PUBLIC: dict[str, str] = {
    "Batcher": "batching",
    "EncodedPairs": "batching",
    "TrainIterator": "batching",
    "eval_batches": "batching",
    "padding_efficiency": "batching",
    "encoded_split": "pipeline",
    "eval_split_batches": "pipeline",
    "train_iterator": "pipeline",
    "bucket_lengths": "grouping",
    "SOURCES": "config",
    "cache_dir": "preparation",
    "get_tokenizer": "preparation",
    "prepare_data": "preparation",
    "prepared_path": "preparation",
    "run_splits": "preparation",
    "load_pairs": "sources",
    "synthetic_pairs": "synthetic",
    "BOS_ID": "tokenizer",
    "EOS_ID": "tokenizer",
    "PAD_ID": "tokenizer",
    "Tokenizer": "tokenizer",
    "UNK_ID": "tokenizer",
    "load_tokenizer": "tokenizer",
    "train_tokenizer": "tokenizer",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    """A public name, or a module of the package, imported on first use."""
    if name not in _PUBLIC:
        return submodule(__name__, name)
    value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
