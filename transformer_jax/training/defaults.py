"""The full run configuration (model, data, train, decode) as an ml_collections ConfigDict.

``transformer_jax/configs/*.py`` start from :func:`default_config` (the paper's base model on
WMT14 en->de) and change what differs. ``config.model`` maps one-to-one onto
:class:`transformer_jax.TransformerConfig` (see ``config.from_config_dict``).
"""

from __future__ import annotations

import dataclasses

import ml_collections

from transformer_jax.model.config import TransformerConfig


def model_defaults() -> ml_collections.ConfigDict:
    """TransformerConfig's defaults (paper base), dtypes as strings."""
    values = {}
    for field in dataclasses.fields(TransformerConfig):
        value = field.default
        if field.name in ("dtype", "param_dtype"):
            value = "float32"
        elif value is None:  # Optional[int] or Optional[bool]: overridable from the command line
            kind = bool if str(field.type).startswith("bool") else int
            value = ml_collections.config_dict.placeholder(kind)
        values[field.name] = value
    return ml_collections.ConfigDict(values)


def default_config() -> ml_collections.ConfigDict:
    """Paper base model (§5, §6.1) on WMT14 English->German."""
    config = ml_collections.ConfigDict()
    config.model = model_defaults()  # model.vocab_size: the shared BPE vocabulary (§5.1)

    config.data = ml_collections.ConfigDict()
    config.data.source = "tfds"  # 'tfds' | 'text' | 'synthetic'
    config.data.tfds_name = "wmt14_translate/de-en"
    config.data.src_lang = "en"
    config.data.tgt_lang = "de"
    config.data.text_dir = ""  # for source='text': {text_dir}/{split}.{lang}[.gz]
    config.data.tfds_data_dir = ""  # for source='tfds': prepared data ('' = TFDS default)
    config.data.data_dir = ""  # prepared (binarized) splits ('' = {workdir}/data_cache)
    config.data.train_split = "train"
    config.data.eval_split = "validation"
    config.data.test_split = "test"
    config.data.tokenizer_train_sentences = 2_000_000
    config.data.max_len = 256  # longer pairs (in tokens) are dropped and counted
    config.data.tokens_per_batch = 25000  # source and target tokens per step (§5.1)
    config.data.packing = False  # False: bucket by length; True: pack into segments
    config.data.bpe_dropout = 0.0  # > 0: sources under BPE-dropout each epoch (not in the paper)
    config.data.seed = 0

    config.train = ml_collections.ConfigDict()
    config.train.num_steps = 100_000  # base model: 100k steps (§5.2)
    config.train.warmup_steps = 4000
    config.train.learning_rate_scale = 1.0
    config.train.cooldown_steps = 0  # > 0: the rate falls linearly to 0 over the last N steps
    config.train.adam_b1 = 0.9
    config.train.adam_b2 = 0.98
    config.train.adam_eps = 1e-9
    config.train.weight_decay = 0.0  # > 0: AdamW's decoupled decay of the matrices (not in paper)
    config.train.label_smoothing = 0.1
    config.train.label_smoothing_convention = "t2t"  # eps/(V-1) elsewhere; 'uniform': eps/V
    config.train.grad_accum_steps = 1
    config.train.prefetch = 2  # steps of batches a thread reads and places ahead (0: inline)
    config.train.parallel = "pmap"  # 'pmap' | 'shard_map'
    config.train.seed = 0
    config.train.log_every = 100
    config.train.eval_every = 5000
    config.train.eval_sentences = 500  # dev sentences decoded for BLEU at eval steps
    config.train.checkpoint_every = 5000
    config.train.keep_checkpoints = 20  # the paper averaged the last 5 (base) / 20 (big)
    config.train.final_test = True  # loss and BLEU on data.test_split after training
    config.train.test_sentences = 0  # test pairs translated for BLEU at the end (0: all)
    config.train.samples = 5  # test translations printed at the end of training

    config.decode = ml_collections.ConfigDict()
    config.decode.beam_size = 4  # §6.1
    config.decode.alpha = 0.6  # length penalty
    config.decode.max_extra_len = 50  # maximum output length = input length + 50
    return config
