"""Dropout (§5.4) from 32-bit random bits: JAX's, or the same bits as elementwise code.

An element is kept where its bits are below ``round((1 - rate) * 2^32)``. The ``xla``
kernel set draws the bits with ``jax.random.bits``; the ``cpu`` set with
:func:`random_bits`, the threefry hash written as plain integer arithmetic that XLA fuses
with the comparison and the scaling (XLA:CPU runs ``jax.random.bits`` as a loop over the
whole array, then the mask as a second pass). Both give the same masks. The gradient
reads the mask from one bit per element (:func:`pack_mask`), not from the bits.
"""

from __future__ import annotations

import functools
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


def _threshold(rate: float) -> int:
    """Bits below this keep their element: ``round((1 - rate) * 2^32)``, at most ``2^32 - 1``."""
    return min(round((1.0 - rate) * 2**32), 2**32 - 1)


def keep_mask(
    rng: Array, rate: float, shape: tuple[int, ...], bits: Bits = jax_bits
) -> tuple[Array, float]:
    """Boolean ``shape`` mask, each entry True with probability ``keep``; returns
    ``(mask, keep)``: ``keep = threshold / 2^32`` with ``threshold = round((1 - rate) *
    2^32)``, within 2^-33 of ``1 - rate`` (capped at ``2^32 - 1`` for rates below 2^-33)."""
    threshold = _threshold(rate)
    return bits(rng, shape) < np.uint32(threshold), threshold / 2**32


def dropout(x: Array, rate: float, rng: Array, bits: Bits = jax_bits) -> Array:
    """Zero each element with probability ``rate``; scale the rest by ``1 / keep``.

    Values and gradients are those of ``where(mask, x / keep, 0)``; the backward pass
    reads the mask packed eight elements to a byte (:func:`pack_mask`), so no mask of
    ``x``'s shape (as booleans or as 32-bit random words) is held between the passes."""
    if _threshold(rate) == 0:
        return jnp.zeros_like(x)
    return _dropout(rate, bits, x, rng)


def pack_mask(mask: Array) -> Array:
    """A boolean array as bytes of eight elements of its last axis each (the last axis
    zero-padded to a multiple of 8); the leading axes, and their sharding, are kept."""
    mask = mask.reshape(mask.shape or (1,))
    width = mask.shape[-1]
    padded = jnp.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, -width % 8)])
    octets = padded.reshape(*mask.shape[:-1], -1, 8).astype(jnp.uint8)
    return jnp.sum(octets << jnp.arange(8, dtype=jnp.uint8), axis=-1, dtype=jnp.uint8)


def unpack_mask(packed: Array, shape: tuple[int, ...]) -> Array:
    """The boolean ``shape`` array that :func:`pack_mask` packed."""
    bits = (packed[..., None] >> jnp.arange(8, dtype=jnp.uint8)) & np.uint8(1)
    width = shape[-1] if shape else 1
    return bits.reshape(*packed.shape[:-1], -1)[..., :width].astype(bool).reshape(shape)


def _apply(x: Array, mask: Array, keep: float) -> Array:
    return jnp.where(mask, x / jnp.asarray(keep, x.dtype), jnp.zeros((), x.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _dropout(rate: float, bits: Bits, x: Array, rng: Array) -> Array:
    mask, keep = keep_mask(rng, rate, x.shape, bits)
    return _apply(x, mask, keep)


def _dropout_fwd(rate: float, bits: Bits, x: Array, rng: Array) -> tuple[Array, Array]:
    mask, keep = keep_mask(rng, rate, x.shape, bits)
    return _apply(x, mask, keep), pack_mask(mask)


def _dropout_bwd(rate: float, bits: Bits, packed: Array, g: Array) -> tuple[Array, None]:
    return _apply(g, unpack_mask(packed, g.shape), _threshold(rate) / 2**32), None


_dropout.defvjp(_dropout_fwd, _dropout_bwd)


def fused_dropout(x: Array, rate: float, rng: Array) -> Array:
    """:func:`dropout` with the bits of :func:`random_bits`."""
    return dropout(x, rate, rng, random_bits)
