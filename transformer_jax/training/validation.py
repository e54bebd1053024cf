"""Checks of a run config that a user can get wrong, before any data loading or compilation."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer_jax.data.tokenizer import PAD_ID, check_vocab_size
from transformer_jax.model.config import TransformerConfig, from_config_dict
from transformer_jax.model.transformer import parameter_shapes
from transformer_jax.options import CUDA_PLATFORMS
from transformer_jax.training.mesh import mesh_shape
from transformer_jax.training.schema import check_fields, resolve_auto


def validate_config(config: ml_collections.ConfigDict) -> TransformerConfig:
    """Raise ``ValueError`` naming the first bad field (each field's check is its schema's,
    :mod:`transformer_jax.training.schema`; here the rules across fields); return the model
    config with its host-dependent 'auto' choices made (``schema.resolve_auto``)."""
    check_fields(config)
    train, data = config.train, config.data
    if train.cooldown_steps > train.num_steps:
        raise ValueError(
            f"train.cooldown_steps={train.cooldown_steps} must be at most "
            f"train.num_steps={train.num_steps}"
        )
    if train.parallel == "mesh":
        mesh_shape(jax.device_count(), train.mesh_model)
    if data.source == "text" and not data.text_dir:
        raise ValueError("data.text_dir must be set for data.source='text'")
    if data.source == "text" and not os.path.isdir(data.text_dir):
        raise ValueError(
            f"data.text_dir={data.text_dir!r} is not a directory (Multi30k: python -m "
            f"transformer_jax.download multi30k --dest {data.text_dir})"
        )
    if data.data_dir and os.path.exists(data.data_dir) and not os.path.isdir(data.data_dir):
        raise ValueError(f"data.data_dir={data.data_dir!r} is not a directory")
    if data.tokens_per_batch < data.max_len:
        raise ValueError(
            f"data.tokens_per_batch={data.tokens_per_batch} must be >= data.max_len={data.max_len}"
        )

    model = from_config_dict(config.model)
    check_vocab_size(model.vocab_size)  # the run's tokenizer has at least that many pieces
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
    if data.max_len > model.max_len:
        raise ValueError(
            f"data.max_len={data.max_len} must be <= model.max_len={model.max_len} "
            "(the longest position the model encodes)"
        )
    model = resolve_auto(model)
    bfloat16_products = model.matmul_precision == "bfloat16" or model.dtype == jnp.bfloat16
    if model.kernel_set == "xla" and bfloat16_products and model.target_platform == "cpu":
        raise ValueError(
            "model.kernels='xla' with bfloat16 products (model.dtype or matmul_precision) does "
            "not train on XLA:CPU (it rejects some of them); use model.kernels='auto' or 'cpu'"
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
