"""Data: shared BPE tokenizer, streamed parallel-text sources, prepared (memory-mapped)
splits, token-budget batches (paper §5.1).

Each name is imported when first used (a module ``__getattr__``): importing the package,
its ``config`` or its ``sources`` imports no JAX.
"""

from __future__ import annotations

from transformer_jax.lazy import lazy_names

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

__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
