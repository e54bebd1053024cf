"""A run's data prepared before training (``transformer-jax prepare``): its tokenizer and the
prepared (binarized) splits that training maps, as ``train_and_evaluate`` would make them."""

from __future__ import annotations

import os

import ml_collections

from transformer_jax import data as data_lib
from transformer_jax.training.validation import validate_config


def prepare_run_data(config: ml_collections.ConfigDict, workdir: str) -> list[str]:
    """The tokenizer and every split the run of ``config`` reads; their directories.
    ValueError (before anything is written) for a config that does not validate."""
    model_config = validate_config(config)
    os.makedirs(workdir, exist_ok=True)
    tokenizer = data_lib.get_tokenizer(
        config.data, workdir, config.model.vocab_size, model_config.tgt_vocab
    )
    splits = data_lib.run_splits(config.data, config.train.final_test)
    data_lib.prepare_data(config.data, workdir, tokenizer, splits)
    return [data_lib.prepared_path(config.data, s, tokenizer, workdir) for s in splits]
