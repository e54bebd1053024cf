"""The grouping of an epoch's pairs into batches: which pair goes to which batch and row.

Bucketing groups pairs by length into :func:`bucket_lengths`, ``tokens_per_batch // L`` rows
for length L; packing fits pairs first-fit into rows of ``max_len`` (see
:mod:`transformer_jax.data.batching`, which fills the planned batches).
"""

from __future__ import annotations

import dataclasses

import numpy as np


def bucket_lengths(max_len: int) -> tuple[int, ...]:
    """Steps of 8 up to 64, of 16 up to 128, 32 up to 256, ... (at most ~1/4 of a length
    wasted by rounding up), then ``max_len`` itself."""
    lengths = []
    length = 8
    while length < max_len:
        lengths.append(length)
        length += max(8, (1 << (length.bit_length() - 1)) // 4)
    return (*lengths, max_len)


def batch_rows(tokens_per_batch: int, length: int, num_shards: int) -> int:
    """Rows of a batch of sequences of ``length``: the token budget, a multiple of shards."""
    rows = tokens_per_batch // length // num_shards * num_shards
    if rows == 0:
        raise ValueError(
            f"data.tokens_per_batch={tokens_per_batch} is too small for one sequence of "
            f"data.max_len={length} tokens on each of {num_shards} devices: it must be "
            f">= {length * num_shards}"
        )
    return rows


@dataclasses.dataclass(frozen=True)
class Planned:
    """One batch of the epoch plan: pair ``pairs[k]`` goes to row ``rows[k]``."""

    length: int
    num_rows: int
    pairs: np.ndarray
    rows: np.ndarray


def plan_buckets(
    order: np.ndarray, lengths: np.ndarray, tokens_per_batch: int, max_len: int, num_shards: int
) -> list[Planned]:
    """Full batches per bucket; each bucket's remainder moves up to the next bucket, so only
    the last batch may have empty rows."""
    buckets = bucket_lengths(max_len)
    of_length = np.searchsorted(np.asarray(buckets), np.arange(max_len + 2))
    of_length = of_length.astype(np.min_scalar_type(len(buckets)))
    bucket_of = of_length[lengths[order]]
    planned = []
    carry = np.zeros(0, order.dtype)
    for b, length in enumerate(buckets):
        pool = np.concatenate([carry, order[bucket_of == b]])
        rows = batch_rows(tokens_per_batch, length, num_shards)
        full = len(pool) // rows * rows
        every_row = np.arange(rows)  # one array shared by the bucket's batches
        for start in range(0, full, rows):
            planned.append(Planned(length, rows, pool[start : start + rows], every_row))
        carry = pool[full:]
    if len(carry):
        planned.append(Planned(buckets[-1], rows, carry, np.arange(len(carry))))
    return planned


FIT_CHUNK = 1 << 10  # pairs whose lengths are Python ints at a time
FIT_BLOCK = 4  # rows per block of the block maxima that skip full rows


def fit_batch(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    order: np.ndarray,
    start: int,
    rows: int,
    max_len: int,
) -> np.ndarray:
    """First fit of the pairs ``order[start:]``, in order, into one empty batch of ``rows``
    rows of ``max_len``: the rows of the pairs up to the first one no row has room for
    (which opens the next batch) or the end of ``order``; the first pair takes row 0. The
    scan skips blocks of rows whose largest free space is too small on one side."""
    chosen: list[int] = []
    blocks = -(-rows // FIT_BLOCK)
    src_free, tgt_free = [max_len] * rows, [max_len] * rows  # per row of the batch
    src_max, tgt_max = [max_len] * blocks, [max_len] * blocks  # per block of rows
    for first in range(start, len(order), FIT_CHUNK):
        pairs = order[first : first + FIT_CHUNK]
        for ls, lt in zip(src_lengths[pairs].tolist(), tgt_lengths[pairs].tolist(), strict=True):
            b, r = 0, -1
            while b < blocks:
                if src_max[b] >= ls and tgt_max[b] >= lt:
                    r, end = b * FIT_BLOCK, min((b + 1) * FIT_BLOCK, rows)
                    while r < end and (src_free[r] < ls or tgt_free[r] < lt):
                        r += 1
                    if r < end:
                        break
                    r = -1
                b += 1
            if r < 0:  # no room: the pair opens the next batch, unless it opens this one
                if chosen:
                    return np.asarray(chosen, np.int32)
                b = r = 0
            src_free[r] -= ls
            tgt_free[r] -= lt
            lo = b * FIT_BLOCK
            src_max[b] = max(src_free[lo : lo + FIT_BLOCK])
            tgt_max[b] = max(tgt_free[lo : lo + FIT_BLOCK])
            chosen.append(r)
    return np.asarray(chosen, np.int32)


def packed_batch(
    order: np.ndarray,
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    start: int,
    tokens_per_batch: int,
    max_len: int,
    num_shards: int,
) -> Planned:
    """The packed batch that opens with pair ``order[start]``: first fit, each pair in the
    first row with room on both sides, until a pair fits in no row. A batch depends only on
    where it opens, so an epoch's batches are planned one at a time as they are read."""
    rows = batch_rows(tokens_per_batch, max_len, num_shards)
    row_of = fit_batch(src_lengths, tgt_lengths, order, start, rows, max_len)
    return Planned(max_len, rows, order[start : start + len(row_of)], row_of)


def plan_packed(
    order: np.ndarray,
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    tokens_per_batch: int,
    max_len: int,
    num_shards: int,
) -> list[Planned]:
    """Every packed batch of the pairs ``order``, in order (see :func:`packed_batch`)."""
    planned, start = [], 0
    while start < len(order):
        args = (start, tokens_per_batch, max_len, num_shards)
        planned.append(packed_batch(order, src_lengths, tgt_lengths, *args))
        start += len(planned[-1].pairs)
    return planned
