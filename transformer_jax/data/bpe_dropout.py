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
        text_of_word = np.repeat(np.arange(len(counts)), counts)[
            np.flatnonzero(np.diff(word, prepend=-1))
        ]
        dropped = np.zeros(len(piece), bool)  # the pair (i, i + 1) dropped
        done_words, done_pieces = [], []
        while len(piece):
            pairs, at = self._pairs(piece, word, dropped)
            starts = np.flatnonzero(np.diff(word, prepend=-1))
            best = np.minimum.reduceat(pairs, starts)
            local = np.cumsum(np.diff(word, prepend=-1) != 0) - 1  # each symbol's word here
            top = np.flatnonzero((pairs == best[local]) & (pairs != _NONE))
            top = top[np.diff(local[top], prepend=-1) != 0]  # the leftmost of each word
            drop = rng.random(len(top)) < dropout
            dropped[top[drop]] = True
            merge = top[~drop]
            piece[merge] = self.merged[at[merge]]
            dropped[merge] = False  # (i, new right neighbour): a new pair
            before = merge[merge > 0] - 1
            dropped[before[word[before] == word[before + 1]]] = False  # (left neighbour, i)
            finished = (best == _NONE)[local]
            done_words.append(word[finished])
            done_pieces.append(piece[finished])
            keep = ~finished
            keep[merge + 1] = False
            piece, word, dropped = piece[keep], word[keep], dropped[keep]
        words = np.concatenate([np.zeros(0, np.int64), *done_words])
        order = np.argsort(words, kind="stable")
        ids = np.concatenate([np.zeros(0, np.int32), *done_pieces])[order]
        per_word = np.bincount(words, minlength=len(text_of_word))
        lengths = np.bincount(text_of_word, per_word, minlength=len(counts)).astype(np.int64)
        return ids, lengths

    def _pairs(
        self, piece: np.ndarray, word: np.ndarray, dropped: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """For each symbol, the rank of the pair it opens with its right neighbour (``_NONE``
        for none or a dropped one) and where that pair is in the table."""
        key = piece[:-1].astype(np.int64) * self.size + piece[1:]
        at = np.minimum(np.searchsorted(self.keys, key), max(len(self.keys) - 1, 0))
        found = (word[1:] == word[:-1]) & ~dropped[:-1]
        if len(self.keys):
            found &= self.keys[at] == key
        else:
            found[:] = False
        ranks = np.where(found, self.rank[at] if len(self.keys) else 0, _NONE)
        return np.append(ranks, _NONE).astype(np.int32), np.append(at, 0)
