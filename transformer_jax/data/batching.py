"""Token-budget batches of sentence pairs (paper §5.1: "Sentence pairs were batched together
by approximate sequence length. Each training batch contained a set of sentence pairs
containing approximately 25000 source tokens and 25000 target tokens.").

A batch holds at most ``tokens_per_batch`` source slots and as many target slots (padding
included). Two layouts, both with a few fixed shapes so ``jit`` compiles few variants:

* bucketing: pairs grouped by length into buckets (``grouping.bucket_lengths``); a bucket of
  length L has ``tokens_per_batch // L`` rows (rounded down to a multiple of ``num_shards``).
* packing: several pairs per row of length ``max_len``, with ``*_segments`` (1, 2, ...;
  0 = padding) and per-segment ``*_positions`` so attention never crosses pairs.

Layout of one pair: ``src = ids(source) + [EOS]``, ``tgt_in = [BOS] + ids(target)``,
``tgt_out = ids(target) + [EOS]``; its length is ``max(len(src), len(tgt_in))``. Pairs
longer than ``max_len`` are dropped and counted. The order of an epoch is a function of
``(seed, epoch)`` only, so the iterator state (``{'epoch', 'index'}``, packing also
``'pair'``) resumes exactly.
"""

from __future__ import annotations

import dataclasses
import mmap
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from transformer_jax.data.grouping import (
    Planned,
    batch_rows,
    packed_batch,
    plan_buckets,
    plan_packed,
)
from transformer_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

Batch = dict[str, np.ndarray]


def _flat(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """``seqs`` as one token array and the offsets where each sequence starts (and ends)."""
    offsets = np.zeros(len(seqs) + 1, np.int64)
    np.cumsum([len(s) for s in seqs], out=offsets[1:])
    tokens = np.fromiter((t for s in seqs for t in s), np.int32, count=offsets[-1])
    return tokens, offsets


@dataclasses.dataclass(frozen=True)
class EncodedPairs:
    """Token ids of N pairs (no BOS/EOS), stored flat: pair i's source is
    ``src[src_offsets[i]:src_offsets[i + 1]]`` (numpy arrays or memory-mapped ones of a
    prepared split); ``read_counts`` says what reading the split skipped or replaced."""

    src: np.ndarray
    src_offsets: np.ndarray
    tgt: np.ndarray
    tgt_offsets: np.ndarray
    read_counts: dict[str, int] = dataclasses.field(default_factory=dict, compare=False)

    @classmethod
    def from_lists(cls, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]) -> EncodedPairs:
        if len(src) != len(tgt):
            raise ValueError(f"{len(src)} source but {len(tgt)} target sequences")
        return cls(*_flat(src), *_flat(tgt))

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def source(self, i: int) -> np.ndarray:
        return self.src[self.src_offsets[i] : self.src_offsets[i + 1]]

    def target(self, i: int) -> np.ndarray:
        return self.tgt[self.tgt_offsets[i] : self.tgt_offsets[i + 1]]


def token_counts(batch: Batch) -> tuple[int, int]:
    """``(real tokens, token slots)`` of a batch, source and target together."""
    src, tgt = batch["src"], batch["tgt_out"]
    real = np.count_nonzero(src != PAD_ID) + np.count_nonzero(tgt != PAD_ID)
    return int(real), int(src.size + tgt.size)


def padding_efficiency(batch: Batch) -> float:
    """Real tokens / token slots of a batch (source and target together)."""
    real, slots = token_counts(batch)
    return real / slots


_BLOCK = 1 << 20  # pairs whose offsets are read at a time


def _sequence_lengths(offsets: np.ndarray, max_len: int) -> np.ndarray:
    """Each sequence's layout length (its ids + EOS or BOS), capped at ``max_len + 1`` (too
    long), in the narrowest unsigned dtype; memory-mapped offsets are read a block at a
    time with file reads, so their pages stay in the page cache, not in this process."""
    dtype = np.uint16 if max_len < np.iinfo(np.uint16).max else np.uint32
    lengths = np.empty(len(offsets) - 1, dtype)
    for a in range(0, len(lengths), _BLOCK):
        count = min(_BLOCK, len(lengths) - a) + 1
        if isinstance(offsets, np.memmap) and isinstance(offsets.base, mmap.mmap):  # whole file
            at = offsets.offset + a * offsets.itemsize
            block = np.fromfile(offsets.filename, offsets.dtype, count, offset=at)
        else:
            block = offsets[a : a + count]
        lengths[a : a + count - 1] = np.minimum(np.diff(block) + 1, max_len + 1)
    return lengths


class Batcher:
    """Plans and fills batches of ``pairs`` under a token budget (see module docstring).

    With several processes (hosts), every process plans the same global batches and fills
    only its own ``1 / process_count`` of the rows, so all processes step in lockstep with
    equal shapes and every pair is seen by exactly one process.
    """

    def __init__(
        self,
        pairs: EncodedPairs,
        *,
        tokens_per_batch: int,
        max_len: int,
        packing: bool = False,
        num_shards: int = 1,
        process_index: int = 0,
        process_count: int = 1,
    ):
        if num_shards % process_count:
            raise ValueError(
                f"num_shards={num_shards} must be a multiple of process_count={process_count}"
            )
        self.pairs = pairs
        self.tokens_per_batch = tokens_per_batch
        self.max_len = max_len
        self.packing = packing
        self.num_shards = num_shards
        self.process_index = process_index
        self.process_count = process_count
        batch_rows(tokens_per_batch, max_len, num_shards)  # validates the budget early
        self.src_lengths = _sequence_lengths(pairs.src_offsets, max_len)
        self.tgt_lengths = _sequence_lengths(pairs.tgt_offsets, max_len)
        self.lengths = np.maximum(self.src_lengths, self.tgt_lengths)
        kept = [  # < 2**31 pairs
            np.flatnonzero(self.lengths[a : a + _BLOCK] <= max_len).astype(np.int32) + a
            for a in range(0, len(pairs), _BLOCK)
        ]
        self.kept = np.concatenate([np.zeros(0, np.int32), *kept])
        self.dropped_too_long = len(pairs) - len(self.kept)

    def with_pairs(self, pairs: EncodedPairs) -> Batcher:
        """A batcher of the same budget, layout and shards over other ``pairs``."""
        return Batcher(
            pairs,
            tokens_per_batch=self.tokens_per_batch,
            max_len=self.max_len,
            packing=self.packing,
            num_shards=self.num_shards,
            process_index=self.process_index,
            process_count=self.process_count,
        )

    def plan(self, order: np.ndarray) -> list[Planned]:
        """Batches of the pairs ``order`` (indices of kept pairs) in this order."""
        if self.packing:
            args = (self.src_lengths, self.tgt_lengths)
            return plan_packed(order, *args, self.tokens_per_batch, self.max_len, self.num_shards)
        return plan_buckets(
            order, self.lengths, self.tokens_per_batch, self.max_len, self.num_shards
        )

    def packed_batch(self, order: np.ndarray, start: int) -> Planned:
        """The packed batch of the pairs ``order`` that opens with ``order[start]``."""
        args = (self.src_lengths, self.tgt_lengths, start)
        return packed_batch(order, *args, self.tokens_per_batch, self.max_len, self.num_shards)

    def fill(self, planned: Planned) -> Batch:
        """This process's rows of one planned batch as numpy int32 arrays, gathered from the
        (memory-mapped) token arrays by numpy indexing, with no loop over pairs. A row is its
        pairs' sequences (ids + EOS, or BOS + ids) end to end, then padding, so the batch is
        a list of items (each row's pairs, then its padding), each repeated its length."""
        local = planned.num_rows // self.process_count
        first = self.process_index * local
        length = planned.length
        lo, hi = np.searchsorted(planned.rows, (first, first + local))  # rows are in order
        pairs, rows = planned.pairs[lo:hi], planned.rows[lo:hi] - first
        every_row = np.arange(local)
        up_to = np.searchsorted(rows, every_row, "right")  # the pairs of the rows up to each
        row_first = up_to - np.bincount(rows, minlength=local)  # each row's first pair
        pair_item = np.arange(len(pairs)) + rows
        pad_item = up_to + every_row
        slot = np.arange(local * length)
        is_pair = np.ones(len(pairs) + local, bool)
        is_pair[pad_item] = False
        segment = np.zeros(len(pairs) + local, np.int32)  # 1, 2, ... in a row; padding 0
        segment[pair_item] = np.arange(len(pairs)) - row_first[rows] + 1
        batch = {}
        for side in ("src", "tgt"):
            tokens = np.asarray(getattr(self.pairs, side))  # of a memmap: no memmap subclass
            offsets = np.asarray(getattr(self.pairs, f"{side}_offsets"))
            begin = offsets[pairs]
            sizes = offsets[pairs + 1] - begin + 1  # ids + EOS (or BOS)
            ends = np.r_[0, sizes.cumsum()]
            count = np.empty(len(pairs) + local, np.intp)
            count[pair_item] = sizes
            count[pad_item] = length - (ends[up_to] - ends[row_first])
            item_start = count.cumsum() - count
            at = item_start[pair_item]  # where each sequence starts, flat
            shift = np.zeros(len(count), np.intp)
            shift[pair_item] = begin - at
            ids = np.zeros(len(slot), np.int32)  # a split with no token: only EOS and BOS
            if len(tokens):
                ids = tokens.take(np.repeat(shift, count) + slot, mode="clip").astype(np.int32)
            ids[at + sizes - 1] = EOS_ID
            real = np.repeat(is_pair, count)
            if side == "src":
                batch["src"] = np.where(real, ids, PAD_ID)
            else:
                batch["tgt_out"] = np.where(real, ids, PAD_ID)
                ids[1:] = ids[:-1].copy()
                ids[at] = BOS_ID
                batch["tgt_in"] = np.where(real, ids, PAD_ID)
            if self.packing:
                batch[f"{side}_segments"] = np.repeat(segment, count)
                positions = slot.astype(np.int32) - np.repeat(item_start.astype(np.int32), count)
                batch[f"{side}_positions"] = positions * real
        return {key: array.reshape(local, length) for key, array in batch.items()}


class TrainIterator(Iterator[Batch]):
    """Endless training batches, reshuffled every epoch by ``(seed, epoch)``.

    ``get_state()`` is ``{'epoch': int, 'index': int}`` (the next batch), with packing also
    ``'pair'`` (where in the epoch's order of pairs the next batch opens: packed batches are
    planned one at a time as they are read, in the order first fit closes them); an iterator
    given that state with ``set_state`` yields exactly the batches the original would have.
    ``stats()`` has the counts for the log: pairs kept, dropped as too long, batches per
    epoch (packing: None, an epoch ends when its pairs do), and the padding efficiency of the
    batches yielded so far.

    ``resample(epoch)``, when given, supplies each epoch's pairs (the same pairs segmented
    anew, as by BPE-dropout); it must be a function of ``epoch`` only, for exact resumes.
    """

    def __init__(
        self,
        batcher: Batcher,
        seed: int = 0,
        epoch: int = 0,
        index: int = 0,
        resample: Callable[[int], EncodedPairs] | None = None,
    ):
        if len(batcher.kept) == 0:
            raise ValueError(
                f"no training pair is at most data.max_len={batcher.max_len} tokens long"
            )
        self.batcher = batcher
        self.seed = seed
        self.resample = resample
        self._epoch: int | None = None
        self._rng = np.random.default_rng([seed])
        self._order = np.zeros(0, np.int32)
        self._plan: list[Planned] | None = None
        self.pair = 0
        self.set_state({"epoch": epoch, "index": index})
        self._real_tokens = 0
        self._slots = 0

    def _epoch_order(self, epoch: int) -> np.ndarray:
        """The epoch's order of the kept pairs (after its resampling, if any)."""
        if self._epoch != epoch:
            if self.resample is not None:
                self.batcher = self.batcher.with_pairs(self.resample(epoch))
            self._rng = np.random.default_rng([self.seed, epoch])
            self._order = self._rng.permutation(self.batcher.kept)
            self._epoch, self._plan = epoch, None
        return self._order

    def epoch_plan(self, epoch: int) -> list[Planned]:
        """Every batch of the epoch in the order they are yielded: bucketed batches shuffled,
        packed ones in the order of the pairs (planned whole here, not when training)."""
        order = self._epoch_order(epoch)
        if self._plan is None:
            plan = self.batcher.plan(order)
            if not self.batcher.packing:
                plan = [plan[i] for i in self._rng.permutation(len(plan))]
            self._plan = plan
        return self._plan

    def get_state(self) -> dict[str, int]:
        if self.batcher.packing:
            return {"epoch": self.epoch, "index": self.index, "pair": self.pair}
        return {"epoch": self.epoch, "index": self.index}

    def set_state(self, state: dict[str, int]) -> None:
        epoch, index = int(state["epoch"]), int(state["index"])
        if self.batcher.packing:
            if "pair" not in state and index:
                raise ValueError(
                    f"data iterator state {state!r} has no 'pair': it was saved by a packed "
                    "run of an older version, which resumes only where an epoch starts"
                )
            pair = int(state.get("pair", 0))
            valid = epoch >= 0 and index >= 0 and 0 <= pair <= len(self._epoch_order(epoch))
        else:
            valid = epoch >= 0 and 0 <= index <= len(self.epoch_plan(epoch))
            pair = 0
        if not valid:
            raise ValueError(f"invalid data iterator state {state!r}")
        self.epoch, self.index, self.pair = epoch, index, pair

    def _next_planned(self) -> Planned:
        if self.batcher.packing:
            if self.pair >= len(self._epoch_order(self.epoch)):
                self.epoch, self.index, self.pair = self.epoch + 1, 0, 0
            order = self._epoch_order(self.epoch)  # may resample: then a new batcher
            planned = self.batcher.packed_batch(order, self.pair)
            self.pair += len(planned.pairs)
            return planned
        if self.index >= len(self.epoch_plan(self.epoch)):
            self.epoch, self.index = self.epoch + 1, 0
        return self.epoch_plan(self.epoch)[self.index]

    def __next__(self) -> Batch:
        planned = self._next_planned()  # may move to the next epoch's (resampled) pairs
        batch = self.batcher.fill(planned)
        self.index += 1
        real, slots = token_counts(batch)
        self._real_tokens += real
        self._slots += slots
        return batch

    def stats(self) -> dict[str, float | None]:
        per_epoch = None if self.batcher.packing else len(self.epoch_plan(self.epoch))
        return {
            "pairs": len(self.batcher.kept),
            "dropped_too_long": self.batcher.dropped_too_long,
            "batches_per_epoch": per_epoch,
            "padding_efficiency": float(self._real_tokens) / max(self._slots, 1),
        }


def eval_batches(batcher: Batcher) -> list[Batch]:
    """Every kept pair exactly once, shortest first, in a deterministic order."""
    order = batcher.kept[np.argsort(batcher.lengths[batcher.kept], kind="stable")]
    return [batcher.fill(planned) for planned in batcher.plan(order)]
