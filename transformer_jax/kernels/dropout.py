"""Dropout (§5.4) from 32-bit random bits: JAX's, or the same bits as elementwise code.

An element is kept where its bits are below ``round((1 - rate) * 2^32)``. The ``xla``
kernel set draws the bits with ``jax.random.bits``; the ``cpu`` set with
:func:`random_bits`, the threefry hash written as plain integer arithmetic that XLA fuses
with the comparison and the scaling (XLA:CPU runs ``jax.random.bits`` as a loop over the
whole array, then the mask as a second pass). Both give the same masks.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def threefry2x32(key: tuple[Array, Array], x: tuple[Array, Array]) -> tuple[Array, Array]:
    """The Threefry-2x32 block cipher, 20 rounds (Salmon et al. 2011), on uint32 arrays.

    ``key``: two uint32 scalars; ``x``: the two words of each counter. As JAX's own
    (``jax._src.random.threefry2x32``), unrolled.
    """
    ks = (key[0], key[1], key[0] ^ key[1] ^ _PARITY)
    x0, x1 = x[0] + ks[0], x[1] + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))) ^ x0
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def random_bits(rng: Array, shape: tuple[int, ...]) -> Array:
    """``jax.random.bits(rng, shape, jnp.uint32)`` for a threefry key, as elementwise code.

    With JAX's default ``jax_threefry_partitionable``, element ``i`` (row-major) is the
    two output words of threefry2x32 on the counter ``(0, i)``, xor-ed. Other key
    implementations, the other counter layout and arrays of 2^32 elements or more are
    left to ``jax.random.bits``.
    """
    if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
        impl, data = str(jax.random.key_impl(rng)), jax.random.key_data(rng)
    else:
        impl, data = jax.config.jax_default_prng_impl, rng
    size = math.prod(shape)
    if not (impl == "threefry2x32" and jax.config.jax_threefry_partitionable and size < 2**32):
        return jax.random.bits(rng, shape, jnp.uint32)
    index = jax.lax.iota(jnp.uint32, size).reshape(shape)
    hi, lo = threefry2x32((data[0], data[1]), (jnp.zeros_like(index), index))
    return hi ^ lo


Bits = Callable[[Array, tuple[int, ...]], Array]


def jax_bits(rng: Array, shape: tuple[int, ...]) -> Array:
    """``jax.random.bits(rng, shape, jnp.uint32)``."""
    return jax.random.bits(rng, shape, jnp.uint32)


def keep_mask(
    rng: Array, rate: float, shape: tuple[int, ...], bits: Bits = jax_bits
) -> tuple[Array, float]:
    """Boolean ``shape`` mask, each entry True with probability ``keep``; returns
    ``(mask, keep)``: ``keep = threshold / 2^32`` with ``threshold = round((1 - rate) *
    2^32)``, within 2^-33 of ``1 - rate`` (capped at ``2^32 - 1`` for rates below 2^-33)."""
    threshold = min(round((1.0 - rate) * 2**32), 2**32 - 1)
    return bits(rng, shape) < np.uint32(threshold), threshold / 2**32


def dropout(x: Array, rate: float, rng: Array, bits: Bits = jax_bits) -> Array:
    """Zero each element with probability ``rate``; scale the rest by ``1 / keep``."""
    mask, keep = keep_mask(rng, rate, x.shape, bits)
    if keep == 0.0:
        return jnp.zeros_like(x)
    return jnp.where(mask, x / jnp.asarray(keep, x.dtype), jnp.zeros((), x.dtype))


def fused_dropout(x: Array, rate: float, rng: Array) -> Array:
    """:func:`dropout` with the bits of :func:`random_bits`."""
    return dropout(x, rate, rng, random_bits)
