"""Which pair goes to which batch and row: bucket lengths, the bucketed plan's rows, and the
packed plan's first fit against a plain first fit, one pair at a time."""

import numpy as np
import pytest

from transformer_jax.data import grouping


def test_bucket_lengths():
    assert grouping.bucket_lengths(64) == (8, 16, 24, 32, 40, 48, 56, 64)
    assert grouping.bucket_lengths(256)[-9:] == (64, 80, 96, 112, 128, 160, 192, 224, 256)
    assert grouping.bucket_lengths(100)[-1] == 100 and len(grouping.bucket_lengths(1024)) < 30


def first_fit_one_by_one(order, src_lengths, tgt_lengths, rows, max_len):
    """Each pair in the first row with room on both sides; a pair no row has room for opens
    the next batch, where it takes row 0 even if it is too long for it: [(pairs, rows)],
    each batch's pairs by row, a row's in order."""
    batches, src_free, tgt_free = [], [], []
    for i in order.tolist():
        ls, lt = int(src_lengths[i]), int(tgt_lengths[i])
        fits = [r for r in range(len(src_free)) if src_free[r] >= ls and tgt_free[r] >= lt]
        if not fits:
            batches.append([])
            src_free, tgt_free = [max_len] * rows, [max_len] * rows
            fits = [0]
        src_free[fits[0]] -= ls
        tgt_free[fits[0]] -= lt
        batches[-1].append((fits[0], i))
    by_row = [sorted(batch, key=lambda row_pair: row_pair[0]) for batch in batches]
    return [([p for _, p in batch], [r for r, _ in batch]) for batch in by_row]


@pytest.mark.parametrize(
    "seed,n,shards,tokens_per_batch,max_len,longest",
    [
        (0, 3000, 8, 25000, 256, 120),  # base budget, rows left partly empty
        (1, 2000, 1, 64, 16, 17),  # a few rows, pairs filling a row exactly, too-long pairs
        (2, 1500, 2, 96, 8, 9),  # short rows, many exact fills and too-long pairs
        (3, 1, 1, 16, 16, 16),  # one pair: the last batch is partial
        (4, 0, 1, 16, 16, 16),  # no pair
        (5, 4000, 4, 2048, 64, 70),  # 15 rows, pairs up to a row's length
        (6, 3000, 1, 128, 32, 3),  # many short pairs per row: long runs, many taken later
        (7, 2000, 2, 1024, 64, 40),  # Poisson lengths, as in a corpus
    ],
)
@pytest.mark.parametrize("window", [grouping.FIT_WINDOW, 0.01])  # 0.01: windows grown
def test_packed_plan_equals_the_pair_by_pair_first_fit(
    seed, n, shards, tokens_per_batch, max_len, longest, window, monkeypatch
):
    monkeypatch.setattr(grouping, "FIT_WINDOW", window)
    rng = np.random.default_rng(seed)
    if seed == 7:
        src_lengths = 1 + rng.poisson(longest / 3, n)
        tgt_lengths = 1 + rng.poisson(longest / 4, n)
    else:
        src_lengths = rng.integers(1, longest + 1, n)
        tgt_lengths = rng.integers(1, longest + 1, n)
    if 10 < n and longest > 3:  # pairs of exactly max_len, and lengths that fill a row exactly
        src_lengths[::7], tgt_lengths[::11] = max_len, max_len
        src_lengths[3::5], tgt_lengths[3::5] = max_len // 2, max_len // 4
    order = rng.permutation(n).astype(np.int32)
    rows = grouping.batch_rows(tokens_per_batch, max_len, shards)
    for dtype in (np.uint16, np.int32):
        src, tgt = src_lengths.astype(dtype), tgt_lengths.astype(dtype)
        planned = grouping.plan_packed(order, src, tgt, tokens_per_batch, max_len, shards)
        reference = first_fit_one_by_one(order, src, tgt, rows, max_len)
        assert [(p.pairs.tolist(), p.rows.tolist()) for p in planned] == reference
    assert all(p.length == max_len and p.num_rows == rows for p in planned)
    assert len(reference) >= min(n, 1) + (n > 10)  # several batches, the last one partial


def test_first_fit_edge_cases():
    # a pair too long for a row closes the batch before it; opening one, it takes row 0 alone
    src, tgt = np.array([3, 9, 3, 5, 9, 1]), np.array([1, 1, 1, 1, 1, 1])
    count, rows = grouping.first_fit(src, tgt, 2, 8)
    assert (count, rows.tolist()) == (1, [0])
    count, rows = grouping.first_fit(src[1:], tgt[1:], 2, 8)
    assert (count, rows.tolist()) == (3, [0, 1, 1])  # 9 alone; 3 + 5 exactly full; 9 closes
    count, rows = grouping.first_fit(src[:0], tgt[:0], 2, 8)
    assert (count, rows.tolist()) == (0, [])
    # exactly full rows; a pair that row 0 takes after its run ended (the 3), inside row 1's
    count, rows = grouping.first_fit(np.array([4, 4, 5, 3, 1]), np.array([1, 1, 1, 1, 1]), 3, 8)
    assert (count, rows.tolist()) == (5, [0, 0, 1, 1, 2])
    count, rows = grouping.first_fit(np.array([5, 4, 3, 1]), np.array([1, 1, 1, 1]), 2, 8)
    assert (count, rows.tolist()) == (4, [0, 1, 0, 1])


def test_bucketed_plan_rows_are_in_order():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 65, 3000)
    order = rng.permutation(3000)
    planned = grouping.plan_buckets(order, lengths, 2048, 64, 4)
    assert sorted(np.concatenate([p.pairs for p in planned]).tolist()) == list(range(3000))
    for p in planned:
        assert (np.diff(p.rows) == 1).all() and p.rows[0] == 0
        assert (lengths[p.pairs] <= p.length).all()
        assert len(p.pairs) == p.num_rows or p is planned[-1]
