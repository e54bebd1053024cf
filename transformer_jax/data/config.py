"""``DataConfig``: the ``data`` section of a run's config, each field declared once with its
default, check and help (:func:`transformer_jax.fields.setting`); the data sources' names.

Importing it imports no JAX, NumPy or TensorFlow: a command's ``--help`` and its config's
checks read it before the library is imported.
"""

from __future__ import annotations

import dataclasses

from transformer_jax.fields import FLAG, TEXT, integer, number, one_of, setting

SOURCES = ("tfds", "text", "synthetic")  # data.source: transformer_jax.data.sources


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """``config.data``: where the pairs come from and how they are batched."""

    source: str = setting(
        "tfds", "'tfds', 'text' or 'synthetic' (the embedded task)", one_of(*SOURCES)
    )
    tfds_name: str = setting("wmt14_translate/de-en", "the TFDS dataset (source='tfds')", TEXT)
    src_lang: str = setting("en", "the source language's code", TEXT)
    tgt_lang: str = setting("de", "the target language's code", TEXT)
    text_dir: str = setting(
        "", "source='text': {text_dir}/{split}.{lang}[.gz]", TEXT, resumable=True
    )
    tfds_data_dir: str = setting(
        "", "source='tfds': the prepared data ('': TFDS's default)", TEXT, resumable=True
    )
    data_dir: str = setting(
        "", "the prepared (binarized) splits ('': {workdir}/data_cache)", TEXT, resumable=True
    )
    train_split: str = setting("train", "the split trained on", TEXT)
    eval_split: str = setting("validation", "the split of the dev loss and BLEU", TEXT)
    test_split: str = setting("test", "the split of the final test (train.final_test)", TEXT)
    tokenizer_train_sentences: int = setting(
        2_000_000, "sentences the BPE tokenizer is trained on", integer(1)
    )
    prepare_workers: int = setting(
        0,
        "processes that encode the splits and sample BPE-dropout's epochs (0: one per core)",
        integer(0),
        resumable=True,
    )
    max_len: int = setting(256, "longer pairs (in tokens) are dropped and counted", integer(1))
    tokens_per_batch: int = setting(
        25000, "source (and as many target) tokens per step over all devices (§5.1)", integer(1)
    )
    packing: bool = setting(False, "False: bucket by length; True: pack pairs into rows", FLAG)
    bpe_dropout: float = setting(
        0.0, "> 0: sources under BPE-dropout each epoch (not in the paper)", number(0, 1)
    )
    seed: int = setting(0, "the order of the pairs", integer(0))
