"""Data: shared BPE tokenizer, streamed parallel-text sources, prepared (memory-mapped)
splits, token-budget batches (paper §5.1)."""

from transformer_jax.data.batching import (
    Batcher,
    EncodedPairs,
    TrainIterator,
    eval_batches,
    padding_efficiency,
)
from transformer_jax.data.grouping import bucket_lengths
from transformer_jax.data.pipeline import encoded_split, eval_split_batches, train_iterator
from transformer_jax.data.preparation import (
    cache_dir,
    get_tokenizer,
    prepare_data,
    prepared_path,
    run_splits,
)
from transformer_jax.data.sources import SOURCES, load_pairs
from transformer_jax.data.synthetic import synthetic_pairs
from transformer_jax.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    load_tokenizer,
    train_tokenizer,
)

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "SOURCES",
    "UNK_ID",
    "Batcher",
    "EncodedPairs",
    "Tokenizer",
    "TrainIterator",
    "bucket_lengths",
    "cache_dir",
    "encoded_split",
    "eval_batches",
    "eval_split_batches",
    "get_tokenizer",
    "load_pairs",
    "load_tokenizer",
    "padding_efficiency",
    "prepare_data",
    "prepared_path",
    "run_splits",
    "synthetic_pairs",
    "train_iterator",
    "train_tokenizer",
]
