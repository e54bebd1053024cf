"""Checks of a run config against this host (its devices, files and platform), before any data
loading or compilation; the checks of the fields themselves are the config's
(:class:`transformer_jax.training.schema.RunConfig`)."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.transformer import parameter_shapes
from transformer_jax.options import CUDA_PLATFORMS
from transformer_jax.training.mesh import mesh_shape
from transformer_jax.training.schema import RunConfig, resolve_auto


def validate_config(config: RunConfig) -> TransformerConfig:
    """Raise ``ValueError`` naming the first field that this host refuses (the fields' own
    checks and the rules across them ran when ``config`` was made: ``schema.RunConfig``);
    return the model config with its host-dependent 'auto' choices made
    (``schema.resolve_auto``)."""
    train, data = config.train, config.data
    if train.parallel == "mesh":
        mesh_shape(jax.device_count(), train.mesh_model)
    if data.source == "text" and not os.path.isdir(data.text_dir):
        raise ValueError(
            f"data.text_dir={data.text_dir!r} is not a directory (Multi30k: python -m "
            f"transformer_jax.download multi30k --dest {data.text_dir})"
        )
    if data.data_dir and os.path.exists(data.data_dir) and not os.path.isdir(data.data_dir):
        raise ValueError(f"data.data_dir={data.data_dir!r} is not a directory")
    model = resolve_auto(config.model)
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
