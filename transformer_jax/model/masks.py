"""Attention masks: boolean, ``True`` = may attend, broadcastable to
``[batch, heads, q_len, kv_len]`` (paper §3.2.3 for the decoder's causal mask)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array


def padding_mask(tokens: Array, pad_id: int = 0) -> Array:
    """Key mask ``[batch, 1, 1, kv_len]``: ``True`` where ``tokens != pad_id``."""
    return (tokens != pad_id)[:, None, None, :]


def causal_mask(length: int) -> Array:
    """``[1, 1, length, length]`` lower-triangular mask: query i sees keys j <= i (§3.2.3)."""
    return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def segment_mask(q_segments: Array, kv_segments: Array) -> Array:
    """``[batch, 1, q_len, kv_len]``: packed sequences attend only within their segment.

    Segment id 0 marks padding and never attends nor is attended to.
    """
    same = q_segments[:, None, :, None] == kv_segments[:, None, None, :]
    return same & (kv_segments != 0)[:, None, None, :]


def check_mask(mask: Any, batch: int, q_len: int, kv_len: int, heads: int) -> None:
    """A mask must be boolean of rank 4, broadcastable to ``[batch, heads, q_len, kv_len]``
    (``True`` = may attend); a float 0/1 or additive mask is refused."""
    if mask is None:
        return
    shape = getattr(mask, "shape", None)
    if getattr(mask, "dtype", None) != jnp.bool_ or len(shape) != 4:
        raise ValueError(
            "mask must be boolean [batch, heads, q_len, kv_len] (True = may attend; "
            f"float or additive masks are not accepted), got {getattr(mask, 'dtype', None)} "
            f"of shape {shape}"
        )
    for size, want, name in zip(
        shape, (batch, heads, q_len, kv_len), ("batch", "heads", "q_len", "kv_len"), strict=True
    ):
        if size not in (1, want):
            raise ValueError(
                f"mask {shape} does not broadcast to [batch, heads, q_len, kv_len] = "
                f"{(batch, heads, q_len, kv_len)}: its {name} is {size}"
            )


def combine_masks(*masks: Array | None) -> Array | None:
    """Logical AND of the given masks (``None`` entries are ignored)."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    out = present[0]
    for m in present[1:]:
        out = jnp.logical_and(out, m)
    return out
