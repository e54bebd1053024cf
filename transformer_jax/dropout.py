"""Dropout (§5.4: P_drop on sub-layer outputs and embedding sums) from 16 random bits
per element.

``flax.linen.Dropout`` draws 32 bits per element (a float32 uniform); on CPU the threefry
hash behind them was ~16% of a small model's training step. Splitting each 32-bit word
into two 16-bit halves halves that cost; the keep probability becomes
``round((1 - rate) * 2^16) / 2^16`` (within 2^-17 of ``1 - rate``), and kept values are
divided by that exact probability, so the expectation is unchanged.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array

_LEVELS = 1 << 16


def keep_mask(rng: Array, rate: float, shape: tuple[int, ...]) -> tuple[Array, float]:
    """Boolean ``shape`` mask, each entry True with probability ``keep``; returns
    ``(mask, keep)``."""
    threshold = round((1.0 - rate) * _LEVELS)
    size = math.prod(shape)
    words = jax.random.bits(rng, ((size + 1) // 2,), jnp.uint32)
    halves = jnp.stack([words & (_LEVELS - 1), words >> 16], axis=-1).reshape(-1)[:size]
    return (halves < threshold).reshape(shape), threshold / _LEVELS


def dropout(x: Array, rate: float, rng: Array) -> Array:
    """Zero each element with probability ``rate``; scale the rest by ``1 / keep``."""
    mask, keep = keep_mask(rng, rate, x.shape)
    if keep == 0.0:
        return jnp.zeros_like(x)
    return jnp.where(mask, x / jnp.asarray(keep, x.dtype), jnp.zeros((), x.dtype))


class Dropout(nn.Module):
    """:func:`dropout` with a key from the ``'dropout'`` RNG stream, like ``nn.Dropout``."""

    rate: float

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        if deterministic or self.rate == 0.0:
            return x
        return dropout(x, self.rate, self.make_rng("dropout"))
