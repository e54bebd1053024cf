"""LayerNorm whose backward pass works from its output (Apex's "memory efficient" LayerNorm).

``y = (x - mean) / sigma * gamma + beta``, as ``flax.linen.LayerNorm`` computes it (float32
statistics, ``sigma = sqrt(max(E[x^2] - E[x]^2, 0) + epsilon)``). Its derivative needs
``xhat = (x - mean) / sigma``, which :func:`layer_norm` recovers from the output as
``(y - beta) / gamma`` instead of keeping the input: the gradient keeps ``y`` (which the next
product keeps anyway), ``gamma``, ``beta`` and one ``1 / sigma`` per vector. Each ``gamma``
is divided by no smaller in magnitude than :data:`GAMMA_FLOOR`, so a ``gamma`` at 0 gives
finite gradients (its feature's ``gamma`` gradient is then not exact: ``y - beta`` holds no
trace of ``xhat`` there).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Array = jax.Array

GAMMA_FLOOR = 1e-6  # the smallest |gamma| the backward pass divides by


def layer_norm(x: Array, scale: Array, bias: Array, epsilon: float, dtype: jnp.dtype) -> Array:
    """LayerNorm over the last axis of ``x`` with ``scale`` (gamma) and ``bias`` (beta), in
    ``dtype``; its gradient recovers the normalised input from the output."""
    return _layer_norm(x, scale, bias, float(epsilon), jnp.dtype(dtype), jnp.dtype(x.dtype))


def _normalize(x: Array, scale: Array, bias: Array, epsilon: float, dtype: jnp.dtype):
    x32 = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    mean = x32.mean(-1, keepdims=True)
    var = jnp.maximum(0.0, (x32 * x32).mean(-1, keepdims=True) - mean * mean)
    inverse_sigma = lax.rsqrt(var + epsilon)
    y = (x - mean) * (inverse_sigma * scale) + bias
    return y.astype(dtype), inverse_sigma


def _widen(y: Array, dtype: jnp.dtype) -> Array:
    """``y.astype(dtype)``; bfloat16 to float32 by its bits (the float32's high 16), as XLA
    would otherwise cancel the rounding to bfloat16 with this conversion
    (``xla_allow_excess_precision``), recompute ``y`` from ``x`` and keep ``x``."""
    if y.dtype != jnp.bfloat16 or dtype != jnp.float32:
        return y.astype(dtype)
    bits = lax.bitcast_convert_type(y, jnp.uint16).astype(jnp.uint32) * np.uint32(1 << 16)
    return lax.bitcast_convert_type(bits, jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _layer_norm(x, scale, bias, epsilon, dtype, x_dtype):
    return _normalize(x, scale, bias, epsilon, dtype)[0]


def _forward(x, scale, bias, epsilon, dtype, x_dtype):
    y, inverse_sigma = _normalize(x, scale, bias, epsilon, dtype)
    return y, (y, scale, bias, inverse_sigma)


def _backward(epsilon, dtype, x_dtype, residuals, dy):
    y, scale, bias, inverse_sigma = residuals
    compute = inverse_sigma.dtype
    gamma = scale.astype(compute)
    floor = jnp.where(gamma < 0, -GAMMA_FLOOR, GAMMA_FLOOR)
    divisor = jnp.where(jnp.abs(gamma) < GAMMA_FLOOR, floor, gamma)
    y32, beta = _widen(y, compute), bias.astype(compute)
    xhat = (y32 - beta) / divisor
    dy = dy.astype(compute)
    rows = tuple(range(dy.ndim - 1))
    dbias = dy.sum(rows)
    # sum(dy xhat) from y: XLA then keeps no float32 xhat between this sum and dx's fusion
    dscale = ((dy * y32).sum(rows) - beta * dbias) / divisor
    dscale, dbias = dscale.astype(scale.dtype), dbias.astype(bias.dtype)
    dxhat = dy * gamma
    dx = inverse_sigma * (
        dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True)
    )
    return dx.astype(x_dtype), dscale, dbias


_layer_norm.defvjp(_forward, _backward)
