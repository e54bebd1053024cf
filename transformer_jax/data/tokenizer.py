"""One shared source+target sentencepiece BPE vocabulary (paper §5.1: "byte-pair encoding,
which has a shared source-target vocabulary of about 37000 tokens").

The special ids are those of :mod:`transformer_jax.ids` (PAD 0, UNK 1, BOS 2, EOS 3).
Byte fallback turns characters unseen in training into byte pieces, so no input text can
fail to encode. A vocabulary trained with ``targets`` numbers its pieces by their frequency on
the target side, so that the target side can be limited to the first pieces
(``target_vocab_size``) and the output layer to as many rows.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from transformer_jax.data.bpe_dropout import MergeTable
from transformer_jax.ids import (
    BOS_ID,
    EOS_ID,
    NUM_SPECIAL_IDS,
    PAD_ID,
    UNK_ID,
    check_vocab_size,
)

ORDER_CHUNK = 100_000  # distinct target words encoded at a time to count their pieces
_Piece = sentencepiece_model_pb2.ModelProto.SentencePiece


class Tokenizer:
    """A trained sentencepiece model: text <-> ids of the shared vocabulary.

    ``target_vocab_size`` (None: all pieces) limits :meth:`encode_targets` to the first that
    many pieces.
    """

    def __init__(self, model_proto: bytes, target_vocab_size: int | None = None):
        self.model_proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.fingerprint = hashlib.sha1(model_proto).hexdigest()[:16]
        if target_vocab_size is not None and target_vocab_size >= self.vocab_size:
            target_vocab_size = None
        self.target_vocab_size = target_vocab_size
        self._target_sp = self._sp
        self._merges: MergeTable | None = None  # built when first sampled
        if target_vocab_size is not None:
            self._target_sp = spm.SentencePieceProcessor(
                model_proto=_unused_from(model_proto, target_vocab_size)
            )

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def encode_targets(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
        """Token ids of target ``texts`` from the first ``target_vocab_size`` pieces only: a
        word that needs a later piece is split into smaller ones, and a character no first
        piece spells (its byte pieces come later) becomes UNK."""
        ids = self._target_sp.encode(list(texts), num_threads=num_threads)
        if self.target_vocab_size is None:
            return ids
        limit = self.target_vocab_size
        return [[i if i < limit else UNK_ID for i in row] for row in ids]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without BOS/EOS."""
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
        return self._sp.encode(list(texts), num_threads=num_threads)

    def encode_sampled(
        self, texts: Sequence[str], dropout: float, seed: int | Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """BPE-dropout (Provilkov et al., 2020): token ids of ``texts`` with each merge skipped
        with probability ``dropout``, so a word comes out in varying, smaller pieces; ids end
        to end (int32) and each text's count (int64).

        The draws come from ``np.random.default_rng(seed)``
        (:mod:`~transformer_jax.data.bpe_dropout`), so the same ``(texts, dropout, seed)``
        give the same ids in every process.
        """
        if self._merges is None:
            self._merges = MergeTable(self.model_proto)
        return self._merges.sample(texts, dropout, np.random.default_rng(seed))

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first EOS; PAD, BOS and ids outside the vocabulary are
        skipped (a model may have more embedding rows than the tokenizer has pieces)."""
        kept = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID) and 0 <= i < self.vocab_size:
                kept.append(i)
        return self._sp.decode(kept)

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def save(self, path: str) -> None:
        """Write the model to ``path`` through a temporary file of a name no other writer
        uses, renamed into place: a reader sees the old file or the whole new one."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "xb") as f:
            f.write(self.model_proto)
        os.replace(tmp, path)


def _unused_from(model_proto: bytes, first: int) -> bytes:
    """``model_proto`` with its ordinary pieces from id ``first`` on marked unused, so that
    sentencepiece segments with the earlier ones alone."""
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(model_proto)
    for piece in model.pieces[first:]:
        if piece.type == _Piece.NORMAL:
            piece.type = _Piece.UNUSED
    return model.SerializeToString()


def order_by_frequency(model_proto: bytes, words: Mapping[str, int]) -> bytes:
    """``model_proto`` with the same segmentation, its pieces renumbered for texts of these
    ``words`` counts (words split at spaces): after the special ids the pieces of their
    characters (so that any first pieces past those spell every word), then the others; each
    group by how often the pieces occur in the texts, most frequent first (ties and absent
    pieces keep their order). A text's pieces are its words' (pieces never cross a space),
    so each distinct word is encoded once, ``ORDER_CHUNK`` at a time."""
    processor = spm.SentencePieceProcessor(model_proto=model_proto)
    counts: Counter[int] = Counter()
    characters = {"\u2581"}
    iterator = iter((w, n) for w, n in words.items() if w)
    while chunk := list(itertools.islice(iterator, ORDER_CHUNK)):
        texts = [w for w, _ in chunk]
        for (_, n), row in zip(chunk, processor.encode(texts), strict=True):
            for i in row:
                counts[i] += n
        characters.update(c for text in texts for c in text)
    spelling = {processor.piece_to_id(c) for c in characters} - {UNK_ID}
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(model_proto)
    pieces = list(model.pieces)
    rest = sorted(
        range(NUM_SPECIAL_IDS, len(pieces)), key=lambda i: (i not in spelling, -counts[i])
    )
    del model.pieces[:]
    model.pieces.extend(pieces[i] for i in [*range(NUM_SPECIAL_IDS), *rest])
    return model.SerializeToString()


def sample_indices(count: int, max_sentences: int, seed: int = 0) -> np.ndarray:
    """Ascending indices of a uniform sample of at most ``max_sentences`` of ``count``
    sentences, without replacement (all of them if they are no more): drawn at once from a
    generator seeded with ``seed``, so the sample is a function of the three numbers."""
    if count <= max_sentences:
        return np.arange(count)
    return np.sort(np.random.default_rng(seed).choice(count, max_sentences, replace=False))


def train_tokenizer(
    sentences: Iterable[str],
    path: str,
    vocab_size: int,
    *,
    target_words: Mapping[str, int] | None = None,
    target_vocab_size: int | None = None,
) -> Tokenizer:
    """Train a BPE model on ``sentences`` (both languages), save it to ``path``.

    ``vocab_size`` is an upper bound: a corpus too small for it gives a smaller vocabulary
    (``Tokenizer.vocab_size``) instead of failing (a large corpus is sampled first:
    :func:`sample_indices`). Training is quiet and deterministic. With
    ``target_words`` (the target side's word counts, complete once ``sentences`` is read)
    the pieces are numbered by their frequency there (:func:`order_by_frequency`); the
    tokenizer returned limits them to ``target_vocab_size``. ``sentences`` is read once.
    """
    check_vocab_size(vocab_size)
    texts = [t for t in (s.strip() for s in sentences) if t]
    if not texts:
        raise ValueError("cannot train a tokenizer: no non-empty training sentences")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model,
            model_type="bpe",
            vocab_size=vocab_size,
            hard_vocab_limit=False,
            character_coverage=1.0 if len(texts) < 100_000 else 0.9999,
            byte_fallback=True,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            input_sentence_size=0,
            shuffle_input_sentence=False,
            num_threads=1,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise ValueError(f"sentencepiece could not train a vocabulary of {vocab_size}: {e}") from e
    proto = model.getvalue()
    if target_words is not None:
        proto = order_by_frequency(proto, target_words)
    tokenizer = Tokenizer(proto, target_vocab_size)
    tokenizer.save(path)
    return tokenizer


def load_tokenizer(path: str, target_vocab_size: int | None = None) -> Tokenizer:
    """Load a model written by :func:`train_tokenizer`."""
    if not os.path.isfile(path):
        raise ValueError(
            f"no tokenizer at {path!r}: train one with train_tokenizer (train.py writes "
            "{workdir}/tokenizer.model)"
        )
    with open(path, "rb") as f:
        proto = f.read()
    try:
        tokenizer = Tokenizer(proto, target_vocab_size)
    except RuntimeError:
        tokenizer = None
    if tokenizer is None or tokenizer.vocab_size == 0:
        raise ValueError(
            f"{path} is not a sentencepiece model (truncated or damaged); restore it from a "
            "copy, or delete it to train a new one (a run's checkpoints need the original)"
        )
    return tokenizer
