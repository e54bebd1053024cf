"""BPE-dropout (Provilkov et al., 2020) drawn from a numpy generator, so that a seed gives the
same segmentation in every process (sentencepiece's own sampling does not: its seed sets a
generator whose draws also depend on the process).

The merges are sentencepiece's BPE: two adjacent symbols merge when their concatenation is a
piece, the pair of the highest-scoring piece first (ties: the leftmost). As in sentencepiece's
``SampleEncode``, each pair taken from that queue is dropped with probability ``dropout``, for
good (a new pair arises only when a neighbour merges), and a word is done when no pair is
left: the same distribution of segmentations, from another random stream. Pieces never cross
a word (each starts with ``▁``), so the words are sampled side by side, one pair each per
step, over flat arrays (no per-token Python objects).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

_NORMAL = sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL
_WORD = "\u2581"  # sentencepiece's word boundary
_NONE = np.iinfo(np.int32).max  # the rank of no pair


class MergeTable:
    """The merges of a BPE model: each pair of pieces whose concatenation is a piece, that
    piece and its rank (0: the highest score)."""

    def __init__(self, model_proto: bytes):
        model = sentencepiece_model_pb2.ModelProto()
        model.ParseFromString(model_proto)
        ids = {p.piece: i for i, p in enumerate(model.pieces) if p.type == _NORMAL}
        scores = np.array([p.score for p in model.pieces], np.float64)
        rank = np.unique(-scores, return_inverse=True)[1].astype(np.int32)  # equal scores tie
        left, right, merged = [], [], []
        for piece, i in ids.items():
            for cut in range(1, len(piece)):
                a, b = ids.get(piece[:cut]), ids.get(piece[cut:])
                if a is not None and b is not None:
                    left.append(a), right.append(b), merged.append(i)
        self.size = len(model.pieces)
        keys = np.array(left, np.int64) * self.size + np.array(right, np.int64)
        order = np.argsort(keys)
        self.keys = keys[order]
        self.merged = np.array(merged, np.int32)[order]
        self.rank = rank[self.merged]
        self.word_start = np.array([p.piece.startswith(_WORD) for p in model.pieces])
        self.processor = spm.SentencePieceProcessor(model_proto=model_proto)

    def characters(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The texts' symbols before any merge (sentencepiece with every merge skipped, which
        draws no random number): ids end to end and each text's count."""
        rows = self.processor.encode(
            list(texts), enable_sampling=True, alpha=1.0, nbest_size=-1, num_threads=1
        )
        counts = np.fromiter(map(len, rows), np.int64, len(rows))
        ids = np.fromiter(itertools.chain.from_iterable(rows), np.int32, int(counts.sum()))
        return ids, counts

    def sample(
        self, texts: Sequence[str], dropout: float, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """``texts`` segmented under BPE-dropout with draws from ``rng``: ids end to end
        (int32) and each text's count (int64)."""
        piece, counts = self.characters(texts)
        first = np.zeros(len(piece), bool)
        first[(np.cumsum(counts) - counts)[counts > 0]] = True
        word = np.cumsum(first | self.word_start[piece]) - 1  # ascending, one per word
        opens = np.flatnonzero(np.diff(word, prepend=-1))
        text_of_word = np.repeat(np.arange(len(counts)), counts)[opens]
        # each symbol's pair with its right neighbour: its rank (_NONE: none, or dropped)
        rank, at = np.full(len(piece), _NONE, np.int32), np.zeros(len(piece), np.int64)
        self._pairs(piece, word, rank, at, np.arange(len(piece)))
        done_words, done_pieces = [], []
        while len(piece):
            opens = np.flatnonzero(np.diff(word, prepend=-1))
            best = np.minimum.reduceat(rank, opens)
            local = np.repeat(np.arange(len(opens)), np.diff(opens, append=len(piece)))
            top = np.flatnonzero((rank == best[local]) & (rank != _NONE))
            top = top[np.diff(local[top], prepend=-1) != 0]  # the leftmost of each word
            drop = rng.random(len(top)) < dropout
            rank[top[drop]] = _NONE  # dropped for good: a new pair arises only by a merge
            merge = top[~drop]
            piece[merge] = self.merged[at[merge]]
            finished = (best == _NONE)[local]
            done_words.append(word[finished])
            done_pieces.append(piece[finished])
            keep = ~finished
            keep[merge + 1] = False
            moved = np.cumsum(keep) - 1  # where each kept symbol goes
            piece, word, rank, at = piece[keep], word[keep], rank[keep], at[keep]
            merge = moved[merge]
            changed = np.concatenate([merge, merge[merge > 0] - 1])  # (left, i) and (i, right)
            self._pairs(piece, word, rank, at, changed)
        words = np.concatenate([np.zeros(0, np.int64), *done_words])
        order = np.argsort(words, kind="stable")
        ids = np.concatenate([np.zeros(0, np.int32), *done_pieces])[order]
        per_word = np.bincount(words, minlength=len(text_of_word))
        lengths = np.bincount(text_of_word, per_word, minlength=len(counts)).astype(np.int64)
        return ids, lengths

    def _pairs(
        self, piece: np.ndarray, word: np.ndarray, rank: np.ndarray, at: np.ndarray, i: np.ndarray
    ) -> None:
        """``rank`` and ``at`` (where in the table) of the pairs opened by the symbols ``i``
        with their right neighbours, looked up anew."""
        rank[i] = _NONE
        i = i[i + 1 < len(piece)]
        i = i[word[i + 1] == word[i]]
        if not len(i) or not len(self.keys):
            return
        key = piece[i].astype(np.int64) * self.size + piece[i + 1]
        where = np.minimum(np.searchsorted(self.keys, key), len(self.keys) - 1)
        found = self.keys[where] == key
        rank[i[found]] = self.rank[where[found]]
        at[i[found]] = where[found]
