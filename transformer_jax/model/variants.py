"""Later variants of the model's pieces, beyond the paper and off by default.

Each plugs into a module attribute of :class:`~transformer_jax.model.transformer.Transformer`
(and ``Encoder`` / ``Decoder`` / the layers), e.g.
``Transformer(config.replace(positional='none'), score_fn=rope, ffn=GatedFeedForward,
norm=rms_norm)``:

- ``score_fn``: :func:`rope` (rotary positions, Su et al. 2021) and :func:`alibi` (linear
  biases, Press et al. 2022), both from the absolute positions the attention is given;
- ``ffn``: :class:`GatedFeedForward` (SwiGLU, or GEGLU with ``activation=jax.nn.gelu``;
  Shazeer 2020) and :data:`gelu_feed_forward` (Eq. 2 with GELU, Hendrycks & Gimpel 2016);
- ``norm``: :func:`rms_norm` (Zhang & Sennrich 2019).

:func:`named_pieces` gives the pieces ``TransformerConfig``'s ``positional``, ``ffn`` and
``norm_type`` name, so that a run's config chooses them without code.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.model.attention import ScoreFn, Where
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.layers import FFN, FeedForward, Norm, dense, layer_norm
from transformer_jax.model.partitioning import logical

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


FFNS: dict[str, FFN] = {
    "relu": FeedForward,
    "gelu": gelu_feed_forward,
    "glu": functools.partial(GatedFeedForward, activation=jax.nn.sigmoid),
    "geglu": functools.partial(GatedFeedForward, activation=jax.nn.gelu),
    "swiglu": GatedFeedForward,
}
NORM_TYPES: dict[str, Norm] = {"layer": layer_norm, "rms": rms_norm}
SCORES: dict[str, ScoreFn] = {"rope": rope, "alibi": alibi}


def named_pieces(config: TransformerConfig) -> tuple[FFN, Norm, ScoreFn | None]:
    """The FFN, norm and score function (``None``: the paper's) ``config`` names."""
    return FFNS[config.ffn], NORM_TYPES[config.norm_type], SCORES.get(config.positional)
