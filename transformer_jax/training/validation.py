"""Checks of a run config that a user can get wrong, before any data loading or compilation."""

from __future__ import annotations

import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer_jax.data.sources import SOURCES
from transformer_jax.data.tokenizer import PAD_ID
from transformer_jax.model.config import TransformerConfig, from_config_dict
from transformer_jax.model.transformer import parameter_shapes
from transformer_jax.options import CUDA_PLATFORMS
from transformer_jax.training.loss import check_convention
from transformer_jax.training.mesh import mesh_shape
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
        "prefetch",
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
    _int(config, "train", "mesh_model", 1)
    if config.train.parallel == "mesh":
        mesh_shape(jax.device_count(), config.train.mesh_model)

    data = config.data
    if data.source not in SOURCES:
        raise ValueError(f"data.source must be one of {SOURCES}, got {data.source!r}")
    if data.source == "text" and not data.text_dir:
        raise ValueError("data.text_dir must be set for data.source='text'")
    if data.source == "text" and not os.path.isdir(data.text_dir):
        raise ValueError(
            f"data.text_dir={data.text_dir!r} is not a directory (Multi30k: python -m "
            f"transformer_jax.download multi30k --dest {data.text_dir})"
        )
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


_BACKENDS = {"cuda": "gpu", "rocm": "gpu"}  # model.platform -> the JAX backend it runs on


def check_host(model: TransformerConfig) -> None:
    """Raise ``ValueError`` if this host cannot train ``model``: the platform it names is
    not JAX's backend here (no silent fallback to the CPU), cuDNN attention without a GPU,
    or parameters and Adam's state larger than the device's memory."""
    backend = jax.default_backend()
    wanted = _BACKENDS.get(model.platform, model.platform)
    if wanted not in ("auto", backend):
        raise ValueError(
            f"model.platform={model.platform!r} but JAX runs on {backend!r} here (no "
            f"{wanted.upper()} found); train here with model.platform='auto' or {backend!r}"
        )
    if model.attention_impl == "cudnn" and backend not in CUDA_PLATFORMS:
        raise ValueError(
            f"model.attention_impl='cudnn' needs a GPU; JAX runs on {backend!r} here "
            "(use attention_impl='fused')"
        )
    count = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(parameter_shapes(model)))
    need = 4 * count * jnp.dtype(model.param_dtype).itemsize  # parameters, gradients, Adam's m, v
    available = _available_memory()
    if available is not None and need > available:
        raise ValueError(
            f"the model has {count:,} parameters (model.vocab_size={model.vocab_size}, "
            f"d_model={model.d_model}): they, their gradients and Adam's state need "
            f"{need / 2**30:.1f} GiB, more than the {available / 2**30:.1f} GiB available"
        )


def _available_memory() -> int | None:
    """Bytes the first local device can still hold (on the CPU: the host's available
    memory), or None where JAX and the OS do not say."""
    device = jax.local_devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        limit = stats.get("bytes_limit")
        return None if limit is None else int(limit) - int(stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
