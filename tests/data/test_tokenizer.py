"""The shared BPE tokenizer: special ids, round trips, odd input, small corpora, errors."""

import collections
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

from transformer_jax.data import tokenizer as tk
from transformer_jax.data.synthetic import synthetic_pairs
from transformer_jax.ids import MIN_VOCAB_SIZE

CORPUS = [s for pair in synthetic_pairs("validation") for s in pair] + [
    "Die Katze sieht den Hund.",
    "The cat sees the dog.",
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tok") / "tokenizer.model")
    return tk.train_tokenizer(CORPUS, path, 600)


def test_special_ids(tokenizer):
    assert (tk.PAD_ID, tk.UNK_ID, tk.BOS_ID, tk.EOS_ID) == (0, 1, 2, 3)
    sp = tokenizer._sp
    assert [sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()] == [0, 1, 2, 3]
    ids = tokenizer.encode("the cat sees the dog")
    assert ids and min(ids) > tk.EOS_ID  # encode adds no BOS/EOS


def test_round_trip(tokenizer):
    for text in CORPUS[:50] + ["Die Katze sieht den Hund."]:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.decode_batch(tokenizer.encode_batch(CORPUS[:5])) == CORPUS[:5]


def rows(sampled):
    ids, counts = sampled
    assert ids.dtype == np.int32 and counts.dtype == np.int64
    return [row.tolist() for row in np.split(ids, np.cumsum(counts)[:-1])]


def test_bpe_dropout_splits_words_into_smaller_pieces_reproducibly(tokenizer):
    texts = CORPUS[:200]
    plain = tokenizer.encode_batch(texts)
    sampled = rows(tokenizer.encode_sampled(texts, 0.3, seed=7))
    assert tokenizer.decode_batch(sampled) == texts  # the same text, other pieces
    assert sum(map(len, sampled)) > 1.1 * sum(map(len, plain))
    assert rows(tokenizer.encode_sampled(texts, 0.3, seed=7)) == sampled
    assert rows(tokenizer.encode_sampled(texts, 0.3, seed=8)) != sampled
    assert rows(tokenizer.encode_sampled(texts, 0.0, seed=7)) == plain  # no merge dropped
    singles = rows(tokenizer.encode_sampled(texts, 1.0, seed=7))  # every merge dropped
    assert {len(tokenizer._sp.id_to_piece(i)) for row in singles for i in row} == {1}


def test_bpe_dropout_follows_sentencepieces_distribution_in_every_process(tokenizer, tmp_path):
    """The segmentations of a word as often as sentencepiece's own sampling gives them (total
    variation distance within sampling noise); another process draws the same."""
    word, n = ["houses"], 4000
    mine = collections.Counter(map(tuple, rows(tokenizer.encode_sampled(word * n, 0.3, 1))))
    tk.spm.set_random_generator_seed(1)
    theirs = collections.Counter(
        map(tuple, tokenizer._sp.encode(word * n, enable_sampling=True, alpha=0.3, nbest_size=-1))
    )
    assert len(mine) > 3
    assert sum(abs(mine[k] - theirs[k]) for k in mine | theirs) / 2 / n < 0.05
    tokenizer.save(str(tmp_path / "tokenizer.model"))
    code = (
        "import sys; from transformer_jax.data import tokenizer as tk; "
        "t = tk.load_tokenizer(sys.argv[1]); "
        "print(t.encode_sampled(sys.argv[2:], 0.3, [5, 1])[0].tolist())"
    )
    command = [sys.executable, "-c", code, str(tmp_path / "tokenizer.model"), *CORPUS[:20]]
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    found = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    assert found.stdout.split() and found.stdout.strip() == str(
        tokenizer.encode_sampled(CORPUS[:20], 0.3, [5, 1])[0].tolist()
    )


def test_decode_stops_at_eos_and_skips_pad_bos_and_unknown_ids(tokenizer):
    ids = tokenizer.encode("the cat")
    padded = [tk.BOS_ID, *ids, tokenizer.vocab_size + 7, tk.EOS_ID, *tokenizer.encode("dog"), 0]
    assert tokenizer.decode(padded) == "the cat"
    assert tokenizer.decode([tk.PAD_ID, tk.PAD_ID]) == ""


def test_unseen_characters_use_byte_fallback(tokenizer):
    text = "snowman ☃ 漢字 éà"
    ids = tokenizer.encode(text)
    assert tk.UNK_ID not in ids
    assert tokenizer.decode(ids) == text
    for odd in ("bell \x07 here", "bad \ufffd bytes", "\u200b", ""):  # never crash
        assert isinstance(tokenizer.decode(tokenizer.encode(odd)), str)


def test_vocab_size_is_an_upper_bound_on_small_corpora(tmp_path):
    small = tk.train_tokenizer(["a b c", "a b d"], str(tmp_path / "t.model"), 5000)
    assert MIN_VOCAB_SIZE <= small.vocab_size < 5000


def test_save_load_and_determinism(tokenizer, tmp_path):
    path = str(tmp_path / "again.model")
    again = tk.train_tokenizer(CORPUS, path, 600)
    assert again.model_proto == tokenizer.model_proto
    loaded = tk.load_tokenizer(path)
    assert loaded.fingerprint == tokenizer.fingerprint
    assert loaded.vocab_size == tokenizer.vocab_size == 600


def test_sampling_is_bounded_uniform_and_deterministic():
    sample = tk.sample_indices(1000, 10, seed=3)
    assert len(sample) == 10 and len(set(sample.tolist())) == 10
    assert (np.diff(sample) > 0).all() and 0 <= sample[0] and sample[-1] < 1000
    np.testing.assert_array_equal(sample, tk.sample_indices(1000, 10, seed=3))
    assert not np.array_equal(sample, tk.sample_indices(1000, 10, seed=4))
    np.testing.assert_array_equal(tk.sample_indices(2, 10), [0, 1])  # all, in order
    picks = np.concatenate([tk.sample_indices(100, 10, seed) for seed in range(2000)])
    counts = np.bincount(picks, minlength=100)  # each index about 200 times
    assert counts.min() > 140 and counts.max() < 260


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="no tokenizer"):
        tk.load_tokenizer(str(tmp_path / "missing.model"))
    with pytest.raises(ValueError, match="vocab_size"):
        tk.train_tokenizer(CORPUS, str(tmp_path / "t.model"), 10)
    with pytest.raises(ValueError, match="no non-empty"):
        tk.train_tokenizer(["", "  "], str(tmp_path / "t.model"), 300)
    assert not os.path.exists(tmp_path / "t.model")


PAIRS = synthetic_pairs("validation")
TARGETS = [t for _, t in PAIRS]


@pytest.fixture(scope="module")
def target_ordered(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tok") / "tokenizer.model")
    words = collections.Counter(w for t in TARGETS for w in t.split(" "))
    return tk.train_tokenizer(CORPUS, path, 600, target_words=words)


def pieces(tokenizer, rows):
    return [[tokenizer._sp.id_to_piece(i) for i in row] for row in rows]


def test_target_order_keeps_the_segmentation_and_numbers_pieces_by_target_frequency(
    tokenizer, target_ordered
):
    assert target_ordered.model_proto != tokenizer.model_proto
    for texts in (TARGETS, [s for s, _ in PAIRS], ["snowman ☃ 漢字 éà"]):
        ids = target_ordered.encode_batch(texts)
        assert pieces(target_ordered, ids) == pieces(tokenizer, tokenizer.encode_batch(texts))
        plain = tokenizer.decode_batch(tokenizer.encode_batch(texts))
        assert target_ordered.decode_batch(ids) == plain
    sp = target_ordered._sp
    assert [sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()] == [0, 1, 2, 3]
    counts = collections.Counter(i for row in target_ordered.encode_batch(TARGETS) for i in row)
    assert 0 < len(counts) < target_ordered.vocab_size - tk.NUM_SPECIAL_IDS  # English-only
    # first the pieces that spell the targets' characters, then the rest; each by frequency
    characters = len(set("".join(TARGETS).replace(" ", "")) | {"\u2581"})
    spelling = range(tk.NUM_SPECIAL_IDS, tk.NUM_SPECIAL_IDS + characters)
    assert sorted(sp.id_to_piece(i) for i in spelling) == sorted(
        set("".join(TARGETS).replace(" ", "")) | {"\u2581"}
    )
    for group in (spelling, range(spelling.stop, target_ordered.vocab_size)):
        frequencies = [counts[i] for i in group]
        assert frequencies == sorted(frequencies, reverse=True)


def test_encode_targets_uses_only_the_first_pieces(target_ordered, tmp_path):
    used = 1 + max(i for row in target_ordered.encode_batch(TARGETS) for i in row)
    proto = target_ordered.model_proto
    exact = tk.Tokenizer(proto, used)
    assert exact.encode_targets(TARGETS) == target_ordered.encode_batch(TARGETS)

    fewer = tk.Tokenizer(proto, used - 30)  # 30 rare pieces are split
    ids = fewer.encode_targets(TARGETS)
    assert max(max(row) for row in ids) < fewer.target_vocab_size
    assert fewer.decode_batch(ids) == TARGETS
    assert sum(map(len, ids)) > sum(map(len, exact.encode_targets(TARGETS)))
    assert fewer.encode_batch(TARGETS) == target_ordered.encode_batch(TARGETS)  # sources: all

    # a character no target piece spells (its byte pieces come later) is unknown
    (snowman,) = fewer.encode_targets(["lo ☃"])
    assert tk.UNK_ID in snowman and tk.UNK_ID not in fewer.encode("lo ☃")

    whole = tk.Tokenizer(proto, target_ordered.vocab_size + 5)
    assert whole.target_vocab_size is None
    assert whole.encode_targets(TARGETS) == target_ordered.encode_batch(TARGETS)
    path = str(tmp_path / "t.model")
    target_ordered.save(path)
    assert tk.load_tokenizer(path, 100).encode_targets(TARGETS) == (
        tk.Tokenizer(proto, 100).encode_targets(TARGETS)
    )


def test_word_counts_give_the_piece_counts_of_whole_sentences(tokenizer):
    texts = [*TARGETS[:300], "two  spaces", "tab\there", " lead", "trail ", "☃ 漢字 éà", "ａｂ　ｃ"]
    words = collections.Counter(w for t in texts for w in t.split(" "))
    by_sentence = collections.Counter(i for row in tokenizer.encode_batch(texts) for i in row)
    by_word = collections.Counter()
    for n, row in zip(words.values(), tokenizer.encode_batch(list(words)), strict=True):
        by_word.update({i: n * k for i, k in collections.Counter(row).items()})
    assert by_word == by_sentence  # what order_by_frequency counts from the words
    ordered = tk.Tokenizer(tk.order_by_frequency(tokenizer.model_proto, words))
    counts = collections.Counter(i for row in ordered.encode_batch(texts) for i in row)
    assert counts[tk.NUM_SPECIAL_IDS + 1] > 0 and len(counts) > 30
