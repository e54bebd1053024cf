"""Greedy and beam search over the KV cache (paper §6.1): cached = full decoding, exact
search on a tiny vocabulary (one model and an ensemble), batch invariance, EOS and length
limits, one compile per shape."""

import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_CONFIG

from transformer_jax import Transformer
from transformer_jax.ids import BOS_ID, EOS_ID, PAD_ID
from transformer_jax.inference.decoding import (
    _greedy,
    beam_search,
    greedy_search,
    length_penalty,
    temperature_sample,
)

# Six tokens: PAD, UNK, BOS, EOS and two words; an untied output layer whose bias can
# steer how likely EOS is.
CFG = TINY_CONFIG.replace(
    vocab_size=6, num_encoder_layers=1, dropout_rate=0.0, max_len=24, tie_output=False
)
SRC = jnp.array([[4, 5, 4, 5, 3], [5, 4, 3, 0, 0], [4, 3, 0, 0, 0]], jnp.int32)


@pytest.fixture(scope="module")
def params():
    return nn.unbox(jax.jit(Transformer(CFG).init)(jax.random.key(0), SRC, SRC)["params"])


def with_eos_bias(params, bias):
    logits = params["decoder"]["logits"]
    logits = {**logits, "bias": logits["bias"].at[EOS_ID].set(bias)}
    return {**params, "decoder": {**params["decoder"], "logits": logits}}


def lengths(src):
    return np.sum(np.asarray(src) != PAD_ID, axis=1)


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"norm": "pre", "positional": "learned", "attention_impl": "fused", "tie_output": True},
        {"matmul_precision": "bfloat16"},
    ],
)
def test_cached_steps_equal_full_decoder_pass(variant):
    cfg = CFG.replace(vocab_size=11, **variant)
    tgt = jnp.array([[BOS_ID, 4, 7, 9, 5, 3], [BOS_ID, 10, 4, 4, 0, 0], [BOS_ID, 6, 3, 0, 0, 0]])
    params = nn.unbox(jax.jit(Transformer(cfg).init)(jax.random.key(1), SRC, tgt)["params"])
    full = jax.jit(Transformer(cfg).apply)({"params": params}, SRC, tgt)

    model = Transformer(cfg.replace(decode=True))
    encoded = jax.jit(lambda p: model.apply({"params": p}, SRC, method="encode"))(params)
    cache = nn.unbox(
        jax.jit(model.init)(jax.random.key(2), SRC, jnp.zeros((3, 8), jnp.int32))["cache"]
    )
    step = jax.jit(
        lambda cache, enc, tok: model.apply(
            {"params": params, "cache": cache}, enc, SRC, tok, method="decode", mutable=["cache"]
        )
    )
    steps = []
    for t in range(tgt.shape[1]):
        logits, state = step(cache, encoded, tgt[:, t : t + 1])
        cache = state["cache"]
        steps.append(logits)
    real = np.asarray(tgt) != PAD_ID
    np.testing.assert_allclose(
        np.asarray(jnp.concatenate(steps, 1))[real], np.asarray(full)[real], rtol=1e-5, atol=1e-5
    )


def test_greedy_output_format(params):
    out = np.asarray(greedy_search(CFG, params, SRC, max_extra_len=4))
    assert out.shape == (3, 5 + 4) and out.dtype == np.int32
    for row, n in zip(out, lengths(SRC), strict=True):
        ended = np.flatnonzero(row == EOS_ID)
        stop = ended[0] + 1 if ended.size else n + 4
        assert stop <= n + 4 and np.all(row[stop:] == PAD_ID) and np.all(row[:stop] != PAD_ID)


def test_beam_size_one_is_greedy(params):
    for bias in (0.0, 1.0):  # with and without early EOS
        p = with_eos_bias(params, bias)
        greedy = greedy_search(CFG, p, SRC, max_extra_len=6)
        beam = beam_search(CFG, p, SRC, beam_size=1, alpha=0.0, max_extra_len=6)
        np.testing.assert_array_equal(beam, greedy)


def test_eos_ends_and_length_limit_per_sentence(params):
    first_eos = greedy_search(CFG, with_eos_bias(params, 100.0), SRC, max_extra_len=6)
    assert np.all(np.asarray(first_eos)[:, 0] == EOS_ID) and np.all(
        np.asarray(first_eos)[:, 1:] == 0
    )
    beam_eos = beam_search(CFG, with_eos_bias(params, 100.0), SRC, max_extra_len=6)
    np.testing.assert_array_equal(beam_eos, first_eos)

    never = with_eos_bias(params, -100.0)  # output length = input length + max_extra_len
    for out in (
        greedy_search(CFG, never, SRC, max_extra_len=6),
        beam_search(CFG, never, SRC, max_extra_len=6),
    ):
        produced = np.sum(np.asarray(out) != PAD_ID, axis=1)
        np.testing.assert_array_equal(produced, lengths(SRC) + 6)
    capped = greedy_search(CFG, never, SRC, max_len=7)  # an explicit max_len caps it
    assert capped.shape == (3, 7)
    np.testing.assert_array_equal(np.sum(np.asarray(capped) != PAD_ID, 1), [7, 7, 7])


def test_min_len_eos_none_and_sampling_through_the_wrappers(params):
    eager = with_eos_bias(params, 100.0)  # EOS first unless forbidden
    held = np.asarray(greedy_search(CFG, eager, SRC, max_extra_len=6, min_len=2))
    assert np.all(held[:, :2] != EOS_ID) and np.all(held[:, 2] == EOS_ID)
    beamed = np.asarray(beam_search(CFG, eager, SRC, max_extra_len=6, min_len=2))
    np.testing.assert_array_equal(beamed, held)
    ignored = np.asarray(greedy_search(CFG, eager, SRC, max_extra_len=6, eos_id=None))
    np.testing.assert_array_equal(np.sum(ignored != PAD_ID, 1), lengths(SRC) + 6)
    top1 = temperature_sample(CFG, params, SRC, jax.random.key(0), top_k=1, max_extra_len=6)
    np.testing.assert_array_equal(top1, greedy_search(CFG, params, SRC, max_extra_len=6))
    drawn = temperature_sample(CFG, params, SRC, jax.random.key(1), temperature=5.0)
    assert drawn.shape == (3, CFG.max_len)  # 5 + 50 capped by config.max_len
    for row in np.asarray(drawn):
        stop = np.flatnonzero(row == EOS_ID)[0] + 1 if EOS_ID in row else len(row)
        assert np.all(row[:stop] != PAD_ID) and np.all(row[stop:] == PAD_ID)


def test_sentence_alone_equals_inside_padded_batch(params):
    p = params
    batch_greedy = np.asarray(greedy_search(CFG, p, SRC, max_extra_len=6))
    batch_beam, batch_scores = beam_search(CFG, p, SRC, max_extra_len=6, return_all=True)
    for i in (1, 2):
        alone = SRC[i : i + 1, : lengths(SRC)[i]]
        width = alone.shape[1] + 6
        got = np.asarray(greedy_search(CFG, p, alone, max_extra_len=6))[0]
        np.testing.assert_array_equal(got, batch_greedy[i, :width])
        assert np.all(batch_greedy[i, width:] == PAD_ID)
        tokens, scores = beam_search(CFG, p, alone, max_extra_len=6, return_all=True)
        np.testing.assert_array_equal(tokens[0], np.asarray(batch_beam)[i, :, :width])
        np.testing.assert_allclose(scores[0], batch_scores[i], rtol=1e-5)


def sequence_scores(params, src_row, hypotheses, alpha):
    """log P(Y|X) / lp(|Y|) of each hypothesis from one full (uncached) decoder pass; for a
    list of parameter trees (an ensemble), P is the mean of the models' probabilities."""
    n, width = len(hypotheses), max(map(len, hypotheses))
    out = np.full((n, width), PAD_ID, np.int32)
    for j, h in enumerate(hypotheses):
        out[j, : len(h)] = h
    tgt_in = np.concatenate([np.full((n, 1), BOS_ID, np.int32), out[:, :-1]], 1)
    src = jnp.repeat(src_row[None], n, 0)
    members = params if isinstance(params, list) else [params]
    apply = jax.jit(Transformer(CFG).apply)
    each = [jax.nn.log_softmax(apply({"params": p}, src, jnp.asarray(tgt_in))) for p in members]
    mean = jax.nn.logsumexp(jnp.stack(each), axis=0) - np.log(len(members))
    log_probs = jax.nn.log_softmax(mean.at[..., PAD_ID].set(-jnp.inf))
    picked = jnp.take_along_axis(log_probs, jnp.asarray(out)[..., None], -1)[..., 0]
    total = jnp.sum(jnp.where(out != PAD_ID, picked, 0.0), 1)
    return np.asarray(total / length_penalty(jnp.array([len(h) for h in hypotheses]), alpha))


@pytest.mark.parametrize("models", [1, 2])
def test_large_beam_finds_the_exhaustive_best(params, models):
    """Every hypothesis of length <= 3 (EOS-terminated, or cut at the limit) is scored, by
    one model and by an ensemble of two."""
    alpha, limit = 0.6, 3
    words = [t for t in range(CFG.vocab_size) if t not in (PAD_ID, EOS_ID)]
    hypotheses = [[EOS_ID]] + [[w, EOS_ID] for w in words]
    hypotheses += [[a, b, c] for a, b in itertools.product(words, words) for c in words + [EOS_ID]]
    p = with_eos_bias(params, 0.5)
    if models == 2:
        p = nn.unbox([p, jax.jit(Transformer(CFG).init)(jax.random.key(7), SRC, SRC)["params"]])
    tokens, scores = beam_search(
        CFG, p, SRC, beam_size=96, alpha=alpha, max_len=limit, return_all=True
    )
    for i in range(SRC.shape[0]):
        expected = sequence_scores(p, SRC[i], hypotheses, alpha)
        order = np.argsort(-expected)
        best = hypotheses[order[0]]
        np.testing.assert_array_equal(np.asarray(tokens)[i, 0, : len(best)], best)
        found = np.asarray(scores)[i]
        assert np.sum(np.isfinite(found)) == len(hypotheses)
        np.testing.assert_allclose(found[: len(hypotheses)], expected[order], rtol=1e-4, atol=1e-5)


def test_return_all_is_sorted_and_best_is_first(params):
    tokens, scores = beam_search(CFG, params, SRC, max_extra_len=6, return_all=True)
    assert tokens.shape == (3, 4, 11) and scores.shape == (3, 4)
    assert np.all(np.diff(np.asarray(scores), axis=1) <= 0)
    np.testing.assert_array_equal(beam_search(CFG, params, SRC, max_extra_len=6), tokens[:, 0])


def test_ensemble_of_copies_decodes_as_the_model(params):
    p = with_eos_bias(params, 0.5)
    np.testing.assert_array_equal(
        greedy_search(CFG, [p, p], SRC, max_extra_len=6),
        greedy_search(CFG, p, SRC, max_extra_len=6),
    )
    alone = beam_search(CFG, p, SRC, max_extra_len=6, return_all=True)
    copies = beam_search([CFG, CFG.replace(dropout_rate=0.3)], (p, p), SRC, max_extra_len=6,
                         return_all=True)  # fmt: skip
    np.testing.assert_array_equal(copies[0], alone[0])
    np.testing.assert_allclose(copies[1], alone[1], rtol=1e-5)
    key = jax.random.key(3)
    np.testing.assert_array_equal(
        temperature_sample(CFG, [p, p], SRC, key), temperature_sample(CFG, p, SRC, key)
    )


@pytest.mark.parametrize(
    "config, models, message",
    [
        ([CFG], 2, "a config for each"),
        (CFG, 0, "one or more models"),
        ([CFG, CFG.replace(vocab_size=7)], 2, "tgt_vocab"),
        ([CFG, CFG.replace(max_len=20)], 2, "max_len"),
        ([CFG, CFG], 1, "TransformerConfig"),
    ],
)
def test_bad_ensembles_raise(params, config, models, message):
    p = params if models == 1 else [params] * models
    with pytest.raises(ValueError, match=message):
        beam_search(config, p, SRC)


def test_compiles_once_per_shape(params):
    greedy_search(CFG, params, SRC, max_extra_len=5)
    size = _greedy._cache_size()
    greedy_search(CFG, with_eos_bias(params, 1.0), (SRC + 1) % 6, max_extra_len=5)
    greedy_search(CFG.replace(decode=True), params, SRC, max_extra_len=5)
    assert _greedy._cache_size() == size


def test_length_penalty():
    np.testing.assert_allclose(length_penalty(jnp.array([1, 7]), 0.6), [1.0, 2.0**0.6])
    np.testing.assert_allclose(length_penalty(jnp.array([1, 7]), 0.0), [1.0, 1.0])


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"beam_size": 0}, "beam_size"),
        ({"alpha": -0.5}, "alpha"),
        ({"max_len": 25}, "max_len"),
        ({"max_extra_len": -1}, "max_extra_len"),
        ({"eos_id": 6}, "eos_id"),
        ({"eos_id": 0}, "eos_id"),
    ],
)
def test_bad_arguments_raise(params, kwargs, field):
    with pytest.raises(ValueError, match=field):
        beam_search(CFG, params, SRC, **kwargs)


def test_bad_source_raises(params):
    with pytest.raises(ValueError, match="src"):
        greedy_search(CFG, params, SRC[0])
    with pytest.raises(ValueError, match="src"):
        greedy_search(CFG, params, jnp.ones((2, 30), jnp.int32))


def test_beam_search_takes_init_output_boxed_or_plain(params):
    boxed = jax.jit(Transformer(CFG).init)(jax.random.key(0), SRC, SRC)["params"]
    is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)  # noqa: E731
    assert all(map(is_box, jax.tree.leaves(boxed, is_leaf=is_box)))  # init: every one named
    plain = beam_search(CFG, params, SRC, max_extra_len=6)
    np.testing.assert_array_equal(beam_search(CFG, boxed, SRC, max_extra_len=6), plain)
