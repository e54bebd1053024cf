"""The embedded synthetic task: deterministic, sized, held out, and not word for word."""

import time

import pytest

from transformer_jax.data import synthetic
from transformer_jax.data.synthetic import synthetic_pairs


@pytest.fixture(scope="module")
def splits():
    synthetic._splits.cache_clear()
    start = time.perf_counter()
    result = {name: synthetic_pairs(name) for name in ("train", "validation", "test")}
    return result, time.perf_counter() - start


def test_sizes_speed_and_lengths(splits):
    data, seconds = splits
    assert {k: len(v) for k, v in data.items()} == {
        "train": 40_000,
        "validation": 1000,
        "test": 1000,
    }
    assert seconds < 4.0  # ~1 s alone; generous on a shared 2-core machine
    for pairs in data.values():
        for source, target in pairs:
            assert 4 <= len(source.split()) <= 15
            assert 1 <= len(target.split()) <= 20


def test_deterministic_and_seeded(splits):
    data, _ = splits
    synthetic._splits.cache_clear()
    assert synthetic_pairs("test") == data["test"]
    assert synthetic_pairs("test", seed=1) != data["test"]


def test_held_out_sentences_are_unseen(splits):
    data, _ = splits
    train = {s for s, _ in data["train"]}
    dev, test = {s for s, _ in data["validation"]}, {s for s, _ in data["test"]}
    assert len(train) == 40_000 and len(dev) == 1000 and len(test) == 1000
    assert not train & dev and not train & test and not dev & test


def test_vocabulary_in_the_hundreds(splits):
    data, _ = splits
    source_words = {w for s, _ in data["train"] for w in s.split()}
    target_words = {w for _, t in data["train"] for w in t.split()}
    assert 200 <= len(source_words) < 1000
    assert 200 <= len(target_words) < 1000
    assert not source_words & target_words - {"ne"}  # invented target words


def test_translation_is_a_function(splits):
    data, _ = splits
    lex = synthetic._Lexicon(0)
    # Each source word that is a noun always maps to the same target stem.
    for source, target in data["train"][:2000]:
        for word in source.split():
            if word in lex.noun:
                assert any(t.startswith(lex.noun[word]) for t in target.split())


def test_reordering_and_agreement(splits):
    data, _ = splits
    lex = synthetic._Lexicon(0)
    vowel = synthetic.GENDER_VOWELS
    verbs = {synthetic._verb_s(v): v for v in synthetic.TRANSITIVE}
    verb_final = adjective_after = 0
    for source, target in data["train"]:
        words, out = source.split(), target.split()
        # "the N Vs the N" (SVO) -> "ART N ART-acc N V" (SOV)
        if len(words) == 5 and words[0] == words[3] == "the" and words[2] in verbs:
            if words[1] in lex.noun and words[4] in lex.noun:
                subject, obj = words[1], words[4]
                assert out == [
                    "l" + vowel[lex.gender[subject]],
                    lex.noun[subject],
                    "l" + vowel[lex.gender[obj]] + "m",
                    lex.noun[obj],
                    lex.verb[verbs[words[2]]],
                ]
                verb_final += 1
        # "the ADJ N ..." -> "ART N ADJ+gender ...": the adjective agrees and follows
        if len(words) > 3 and words[0] == "the" and words[1] in lex.adjective:
            if words[2] in lex.noun:
                g = vowel[lex.gender[words[2]]]
                assert out[:3] == ["l" + g, lex.noun[words[2]], lex.adjective[words[1]] + g]
                adjective_after += 1
    assert verb_final > 10 and adjective_after > 100
    # All three genders occur, so articles and adjectives really vary with the noun.
    assert set(lex.gender.values()) == {0, 1, 2}


def test_bad_split():
    with pytest.raises(ValueError, match="split"):
        synthetic_pairs("dev")
