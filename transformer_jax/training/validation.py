"""Checks of a run config that a user can get wrong, before any data loading or compilation."""

from __future__ import annotations

import math
import os
from typing import Any

import jax.numpy as jnp
import ml_collections

from transformer_jax.data.sources import SOURCES
from transformer_jax.data.tokenizer import PAD_ID
from transformer_jax.model.config import TransformerConfig, from_config_dict
from transformer_jax.training.loss import check_convention
from transformer_jax.training.parallel import check_kind


def _int(config: Any, section: str, name: str, minimum: int) -> None:
    value = config[section][name]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{section}.{name} must be an integer >= {minimum}, got {value!r}")


def _float(config: Any, section: str, name: str, low: float, high: float | None = None) -> None:
    value = config[section][name]
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > low
    if high is not None:
        ok = ok and value < high
    if not ok:
        bound = f"in ({low}, {high})" if high is not None else f"> {low}"
        raise ValueError(f"{section}.{name} must be a number {bound}, got {value!r}")


def _finite(tree: Any, prefix: str = "") -> None:
    for name, value in tree.items():
        if isinstance(value, dict):
            _finite(value, f"{prefix}{name}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{prefix}{name} must be a finite number, got {value!r}")


def validate_config(config: ml_collections.ConfigDict) -> TransformerConfig:
    """Raise ``ValueError`` naming the first bad field; return the model config."""
    _finite(config.to_dict())
    for name in ("num_steps", "warmup_steps", "grad_accum_steps", "log_every", "keep_checkpoints"):
        _int(config, "train", name, 1)
    for name in (
        "eval_every",
        "checkpoint_every",
        "eval_sentences",
        "test_sentences",
        "samples",
        "seed",
        "cooldown_steps",
    ):
        _int(config, "train", name, 0)
    if config.train.cooldown_steps > config.train.num_steps:
        raise ValueError(
            f"train.cooldown_steps={config.train.cooldown_steps} must be at most "
            f"train.num_steps={config.train.num_steps}"
        )
    _float(config, "train", "learning_rate_scale", 0.0)
    _float(config, "train", "adam_b1", -1e-12, 1.0)
    _float(config, "train", "adam_b2", -1e-12, 1.0)
    _float(config, "train", "adam_eps", 0.0)
    _float(config, "train", "weight_decay", -1e-12)
    _float(config, "train", "label_smoothing", -1e-12, 1.0)
    check_convention(config.train.label_smoothing_convention, "train.label_smoothing_convention")
    check_kind(config.train.parallel)

    data = config.data
    if data.source not in SOURCES:
        raise ValueError(f"data.source must be one of {SOURCES}, got {data.source!r}")
    if data.source == "text" and not data.text_dir:
        raise ValueError("data.text_dir must be set for data.source='text'")
    if data.source == "text" and not os.path.isdir(data.text_dir):
        raise ValueError(f"data.text_dir={data.text_dir!r} is not a directory")
    if data.data_dir and os.path.exists(data.data_dir) and not os.path.isdir(data.data_dir):
        raise ValueError(f"data.data_dir={data.data_dir!r} is not a directory")
    for name in ("max_len", "tokens_per_batch"):
        _int(config, "data", name, 1)
    if data.tokens_per_batch < data.max_len:
        raise ValueError(
            f"data.tokens_per_batch={data.tokens_per_batch} must be >= data.max_len={data.max_len}"
        )

    _float(config, "data", "bpe_dropout", -1e-12, 1.0)

    _int(config, "decode", "beam_size", 1)
    _int(config, "decode", "max_extra_len", 0)
    _float(config, "decode", "alpha", -1e-12)

    model = from_config_dict(config.model)
    if model.pad_id != PAD_ID:
        raise ValueError(
            f"model.pad_id={model.pad_id} must be {PAD_ID}: the tokenizer and the batches "
            f"pad with id {PAD_ID}"
        )
    if model.attention_impl == "cudnn" and data.max_len % 8:
        raise ValueError(
            f"data.max_len={data.max_len} must be a multiple of 8 with "
            "model.attention_impl='cudnn' (cuDNN's sequence lengths; the buckets below it are)"
        )
    bfloat16_products = model.matmul_precision == "bfloat16" or model.dtype == jnp.bfloat16
    if model.kernel_set == "xla" and bfloat16_products and model.target_platform == "cpu":
        raise ValueError(
            "model.kernels='xla' with bfloat16 products (model.dtype or matmul_precision) does "
            "not train on XLA:CPU (it rejects some of them); use model.kernels='auto' or 'cpu'"
        )
    if data.max_len > model.max_len:
        raise ValueError(
            f"data.max_len={data.max_len} must be <= model.max_len={model.max_len} "
            "(the longest position the model encodes)"
        )
    return model
