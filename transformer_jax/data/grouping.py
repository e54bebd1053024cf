"""The grouping of an epoch's pairs into batches: which pair goes to which batch and row.

Bucketing groups pairs by length into :func:`bucket_lengths`, ``tokens_per_batch // L`` rows
for length L; packing fits pairs first-fit into rows of ``max_len`` (see
:mod:`transformer_jax.data.batching`, which fills the planned batches).
"""

from __future__ import annotations

import bisect
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
    """One batch of the epoch plan: pair ``pairs[k]`` goes to row ``rows[k]``; the pairs
    are in the order of their rows, a row's in the order they are laid out in it."""

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


FIT_WINDOW = 1.25  # pairs first looked at per batch: this times a batch's slots / mean length


def first_fit(src: np.ndarray, tgt: np.ndarray, rows: int, max_len: int) -> tuple[int, np.ndarray]:
    """First fit of pairs of lengths ``src`` and ``tgt``, in order, into ``rows`` empty rows
    of ``max_len``, up to the first pair no row has room for (a first pair too long for a
    row takes row 0 alone): how many pairs fit and each one's row.

    A pair goes to row r exactly when it fits beside the pairs row r took before it, so the
    rows are filled one after another: first the run of the pairs left that fits (bisected
    in the prefix sums, past the pairs in it that earlier rows took), then each later pair
    that fits the room left, the first such found by a vectorised comparison over the rest
    of the window (skipped where the least length of a side from there on is too long).
    """
    n = len(src)
    s, t = src.astype(np.int64), tgt.astype(np.int64)
    s_sum, t_sum = [0, *s.cumsum().tolist()], [0, *t.cumsum().tolist()]
    never = [max_len + 1] * 2  # past the end: no pair
    s_least = np.minimum.accumulate(s[::-1])[::-1].tolist() + never  # of pair p and later
    t_least = np.minimum.accumulate(t[::-1])[::-1].tolist() + never
    s_left, t_left = s.astype(np.int32), t.astype(np.int32)  # taken: max_len + 1, fits no row
    picked: list[int] = []  # pairs taken after their row's run, in order; rows, lengths
    picked_row: list[int] = []
    picked_s: list[int] = []
    picked_t: list[int] = []
    heads = [0]
    head = 0
    if n and (s_sum[1] > max_len or t_sum[1] > max_len):
        head = 1
        heads.append(1)
    for r in range(len(heads) - 1, rows):
        if head >= n:
            break
        first = bisect.bisect_left(picked, head)
        skip, last = (0, 0), first
        while True:  # the run's end, past the pairs in it that earlier rows took (`skip`)
            end = (
                min(
                    bisect.bisect_right(s_sum, s_sum[head] + max_len + skip[0]),
                    bisect.bisect_right(t_sum, t_sum[head] + max_len + skip[1]),
                )
                - 1
            )  # pairs head..end-1 fit, pair `end` does not
            if bisect.bisect_right(picked, end) == last:
                break
            last = bisect.bisect_right(picked, end)
            skip = (sum(picked_s[first:last]), sum(picked_t[first:last]))
        s_skip, t_skip = skip
        if end == head:  # too long for a row: it fits no row
            break
        s_room = max_len - (s_sum[end] - s_sum[head] - s_skip)
        t_room = max_len - (t_sum[end] - t_sum[head] - t_skip)
        head = end
        heads.append(head)
        after = end + 1
        while s_room >= s_least[after] and t_room >= t_least[after]:
            fits = s_left[after:] <= s_room
            fits &= t_left[after:] <= t_room
            q = int(fits.argmax())
            if not fits[q]:
                break
            q += after
            s_left[q] = t_left[q] = max_len + 1
            ls, lt = s_sum[q + 1] - s_sum[q], t_sum[q + 1] - t_sum[q]
            at = bisect.bisect_left(picked, q)
            picked.insert(at, q)
            picked_row.insert(at, r)
            picked_s.insert(at, ls)
            picked_t.insert(at, lt)
            s_room, t_room, after = s_room - ls, t_room - lt, q + 1
    row_of = np.repeat(np.arange(len(heads) - 1, dtype=np.int32), np.diff(heads))
    inside = bisect.bisect_left(picked, head)
    row_of[picked[:inside]] = picked_row[:inside]
    return head, row_of


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
    first row with room on both sides, until a pair fits in no row (:func:`first_fit`, on a
    window of the following pairs, doubled while no pair of it closes the batch). A batch
    depends only on where it opens, so an epoch's batches are planned one at a time as they
    are read."""
    rows = batch_rows(tokens_per_batch, max_len, num_shards)
    probe = order[start : start + 256]
    longer = max(int(src_lengths[probe].sum()), int(tgt_lengths[probe].sum()), 1)
    size = int(FIT_WINDOW * rows * max_len * len(probe) / longer) + 1
    while True:
        window = order[start : start + size]
        count, row_of = first_fit(src_lengths[window], tgt_lengths[window], rows, max_len)
        if count < len(window) or start + size >= len(order):
            break
        size *= 2
    by_row = np.argsort(row_of, kind="stable")
    return Planned(max_len, rows, window[:count][by_row], row_of[by_row])


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
