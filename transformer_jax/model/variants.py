"""Later variants of the model's pieces, beyond the paper and off by default, and the
registry that names them (:func:`register`).

Each is registered under the name ``TransformerConfig`` gives it, and plugs into a module
attribute of :class:`~transformer_jax.model.transformer.Transformer` (and ``Encoder`` /
``Decoder`` / the layers); by name or by module it is the same model, parameter tree
included, e.g. ``TransformerConfig(positional='rope', ffn='swiglu', norm_type='rms')`` or
``Transformer(config, score_fn=rope, ffn=GatedFeedForward, norm=rms_norm)``:

- ``positional`` / ``score_fn``: :func:`rope` (rotary positions, Su et al. 2021) and
  :func:`alibi` (linear biases, Press et al. 2022), both from the absolute positions the
  attention is given; registered as replacing the added positions (none are added);
- ``ffn``: :class:`GatedFeedForward` (``'swiglu'``, ``'geglu'``, ``'glu'``; Shazeer 2020) and
  :data:`gelu_feed_forward` (``'gelu'``: Eq. 2 with GELU, Hendrycks & Gimpel 2016);
- ``norm_type`` / ``norm``: :func:`rms_norm` (``'rms'``, Zhang & Sennrich 2019);
- ``attention``: :class:`GroupedQueryAttention` (Ainslie et al. 2023):
  :func:`grouped_query_attention` (``'grouped_query'``, ``config.num_kv_heads`` K/V heads) and
  :func:`multi_query_attention` (``'multi_query'``, one K/V head; Shazeer 2019).

A piece of your own is registered the same way, ``register('ffn', 'my_glu', MyGLU)``, in a
module that the config file (or notebook) imports: ``--config.model.ffn=my_glu`` then builds it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.model.attention import MultiHeadAttention, Where
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.layers import FeedForward, dense, multi_head_attention
from transformer_jax.model.partitioning import logical
from transformer_jax.model.registry import names, register, ship

__all__ = [
    "GatedFeedForward",
    "GroupedQueryAttention",
    "alibi",
    "gelu_feed_forward",
    "grouped_query_attention",
    "multi_query_attention",
    "names",
    "register",
    "rms_norm",
    "rope",
    "rotate",
]
Array = jax.Array


def rotate(x: Array, positions: Array, base: float = 10000.0) -> Array:
    """Rotary embedding of ``x`` ``[batch, length, heads, dim]`` at int ``positions``
    ``[batch or 1, length]``: the two halves of each head rotated as pairs by
    ``position * base^(-i / (dim/2))``."""
    dim = x.shape[-1]
    if dim % 2:
        raise ValueError(f"rotary positions need an even head dimension, got {dim}")
    half = dim // 2
    frequencies = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = positions.astype(jnp.float32)[..., None, None] * frequencies  # [b, len, 1, half]
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def rope(q: Array, k: Array, where: Where, dot: Callable[[Array, Array], Array]) -> Array:
    """RoPE scores: queries and keys rotated by their positions, then Q K^T / sqrt(d_k)."""
    return dot(rotate(q, where.q_positions), rotate(k, where.kv_positions))


def alibi_slopes(heads: int) -> Array:
    """ALiBi's per-head slopes 2^(-8 i / heads), i = 1..heads."""
    return 2.0 ** (-8.0 * jnp.arange(1, heads + 1, dtype=jnp.float32) / heads)


def alibi(q: Array, k: Array, where: Where, dot: Callable[[Array, Array], Array]) -> Array:
    """ALiBi scores: Q K^T / sqrt(d_k) minus each head's slope times |query pos - key pos|."""
    distance = jnp.abs(where.q_positions[:, None, :, None] - where.kv_positions[:, None, None, :])
    return dot(q, k) - alibi_slopes(q.shape[2])[None, :, None, None] * distance


class GatedFeedForward(nn.Module):
    """GLU feed-forward (Shazeer 2020): (activation(x W) * x V) W2, no biases, d_ff wide;
    SwiGLU with the default ``jax.nn.silu``, GEGLU with ``jax.nn.gelu``."""

    config: TransformerConfig
    activation: Callable[[Array], Array] = jax.nn.silu

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        inner = ("embed", "mlp")
        gate = dense(cfg, cfg.d_ff, "gate", use_bias=False, axes=inner)(x)
        value = dense(cfg, cfg.d_ff, "value", use_bias=False, axes=inner)(x)
        out = dense(cfg, x.shape[-1], "out", use_bias=False, axes=("mlp", "embed"))
        return out(self.activation(gate) * value)


gelu_feed_forward = functools.partial(FeedForward, activation=jax.nn.gelu)
"""Eq. 2 with GELU in place of max(0, .)."""


def rms_norm(config: TransformerConfig, name: str | None = None) -> nn.RMSNorm:
    """RMSNorm (no mean, no bias) with float32 statistics whatever the compute dtype."""
    return nn.RMSNorm(
        epsilon=config.layer_norm_eps,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        scale_init=logical(nn.initializers.ones, ("embed",)),
        name=name,
    )


class GroupedQueryAttention(MultiHeadAttention):
    """Grouped-query attention (Ainslie et al. 2023): ``num_kv_heads`` key and value heads,
    each shared by a group of num_heads / num_kv_heads query heads; one is multi-query
    attention (Shazeer 2019), num_heads the paper's. K/V projections and the KV cache are
    num_heads / num_kv_heads times smaller (logical axis ``kv_heads``)."""

    num_kv_heads: int = 1

    def keys_values(self, inputs_kv: Array) -> tuple[Array, Array]:
        project = functools.partial(self.project, heads=self.num_kv_heads, head_axis="kv_heads")
        key = project("key", dim=self.qk_dim)(inputs_kv)
        return key, project("value", dim=self.v_dim)(inputs_kv)


def grouped_query_attention(config: TransformerConfig, **options: Any) -> nn.Module:
    """GQA with ``config.num_kv_heads`` K/V heads (the attention piece ``'grouped_query'``)."""
    heads = config.kv_heads
    return multi_head_attention(config, module=GroupedQueryAttention, num_kv_heads=heads, **options)


def multi_query_attention(config: TransformerConfig, **options: Any) -> nn.Module:
    """MQA: one K/V head for all query heads (the attention piece ``'multi_query'``)."""
    return multi_head_attention(config, module=GroupedQueryAttention, num_kv_heads=1, **options)


def _even_d_k(config: TransformerConfig) -> str | None:
    d_k = config.head_qk_dim
    return f"rotates pairs of d_k: it needs an even d_k, got {d_k}" if d_k % 2 else None


def _one_kv_head(config: TransformerConfig) -> str | None:
    if config.num_kv_heads in (None, 1):
        return None
    return f"has one K/V head: num_kv_heads={config.num_kv_heads} needs attention='grouped_query'"


ship("positional", "rope", rope, adds="none", needs=_even_d_k)
ship("positional", "alibi", alibi, adds="none")
ship("ffn", "gelu", gelu_feed_forward)
ship("ffn", "glu", functools.partial(GatedFeedForward, activation=jax.nn.sigmoid))
ship("ffn", "geglu", functools.partial(GatedFeedForward, activation=jax.nn.gelu))
ship("ffn", "swiglu", GatedFeedForward)
ship("norm", "rms", rms_norm)
ship("attention", "grouped_query", grouped_query_attention)
ship("attention", "multi_query", multi_query_attention, needs=_one_kv_head)
