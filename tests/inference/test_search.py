"""The generic searches over a step function: beam search against a brute-force reference
of its rules (beam 2-4, alpha 0.6, early stop and EOS firing), min_len, eos_id=None,
sampling, ensembles (mean probabilities), and a decoder-only model decoded through its KV
cache."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_CONFIG

from transformer_jax.ids import BOS_ID, EOS_ID, PAD_ID
from transformer_jax.inference import decoding
from transformer_jax.inference.search import (
    beam,
    ensemble,
    gather_rows,
    greedy,
    length_penalty,
    sample,
)
from transformer_jax.model.transformer import Decoder

VOCAB, LENGTH, TABLE = 9, 6, 97
MULTIPLIERS = np.array([1, 7, 31, 131, 523, 2089, 8363])  # position weights of the prefix hash


def make_table(seed, eos_bias):
    table = 2.0 * np.random.default_rng(seed).standard_normal((TABLE, VOCAB))
    table[:, EOS_ID] += eos_bias
    return table.astype(np.float32)


def toy_step(table):
    """A language model whose next-token logits depend on the whole prefix (a hash of it),
    so that a wrongly reordered cache changes the result. The cache is the prefix."""
    table = jnp.asarray(table)

    def step(tokens, cache):
        t, history = cache["t"], cache["history"]
        history = jax.lax.dynamic_update_slice(history, tokens, (0, t))
        index = jnp.sum(history * MULTIPLIERS[: history.shape[1]], axis=1) % TABLE
        return table[index], {"t": t + 1, "history": history}

    return step


def toy_cache(rows):
    return {"t": jnp.array(0), "history": jnp.zeros((rows, LENGTH + 1), jnp.int32)}


def toy_log_probs(table, prefix):
    """log P(next | BOS + prefix) of the toy model, PAD excluded, in float64; of an
    ensemble when ``table`` is a list of tables: the log of the members' mean probability
    (PAD included), then PAD excluded."""
    history = np.zeros(LENGTH + 1, np.int64)
    history[: len(prefix) + 1] = [BOS_ID, *prefix]
    row = int((history * MULTIPLIERS[: LENGTH + 1]).sum() % TABLE)
    if isinstance(table, list):
        probs = [np.exp(t[row] - t[row].max()) / np.exp(t[row] - t[row].max()).sum() for t in table]
        z = np.log(np.mean(probs, axis=0))
    else:
        z = table[row].astype(np.float64)
    z[PAD_ID] = -np.inf
    return z - np.log(np.exp(z - z.max()).sum()) - z.max()


def reference_beam(table, k, alpha, limit, min_len=0):
    """The rules of search.beam written out on Python lists, every extension of every live
    hypothesis scored. Returns the k best finished (score, tokens), the last step and
    whether the early-stop bound ended the search before the limit."""
    live, finished = [((), 0.0)], []
    for t in range(1, limit + 1):
        candidates = []
        for tokens, log_prob in live:
            log_probs = toy_log_probs(table, tokens)
            if len(tokens) < min_len:
                log_probs[EOS_ID] = -np.inf
            candidates += [(log_prob + lp, tokens + (v,)) for v, lp in enumerate(log_probs)]
        candidates = [c for c in candidates if c[0] > -np.inf]
        candidates = sorted(candidates, key=lambda c: -c[0])[: 2 * k]
        ends = [c[1][-1] == EOS_ID or t >= limit for c in candidates]
        finished += [
            (lp / ((5 + t) / 6) ** alpha, toks)
            for i, ((lp, toks), end) in enumerate(zip(candidates, ends, strict=True))
            if end and i < k
        ]
        finished = sorted(finished, key=lambda f: -f[0])[:k]
        live = [(toks, lp) for (lp, toks), end in zip(candidates, ends, strict=True) if not end]
        live = live[:k]
        bound = live[0][1] / ((5 + limit) / 6) ** alpha if live else -np.inf
        if t < limit and len(finished) == k and finished[-1][0] >= bound:
            return finished, t, True
    return finished, limit, False


@pytest.mark.parametrize("k", [2, 3, 4])
def test_beam_equals_the_reference_with_early_stop_and_eos(k):
    alpha, rows = 0.6, 6
    tables = [make_table(seed, eos_bias=1.0) for seed in range(rows)]
    early = ended_by_eos = 0
    for table in tables:
        expected, _, stopped = reference_beam(table, k, alpha, LENGTH)
        tokens, scores = jax.jit(
            lambda tb: beam(toy_step(tb), toy_cache(k), 1, LENGTH, beam_size=k, alpha=alpha)
        )(table)
        assert len(expected) == k
        np.testing.assert_allclose(scores[0], [s for s, _ in expected], rtol=1e-5)
        for row, (_, hypothesis) in zip(np.asarray(tokens[0]), expected, strict=True):
            np.testing.assert_array_equal(row[: len(hypothesis)], hypothesis)
            assert np.all(row[len(hypothesis) :] == PAD_ID)
        early += stopped
        ended_by_eos += sum(h[-1] == EOS_ID for _, h in expected)
    assert early >= 1 and ended_by_eos >= k  # both rules decided some of these searches


def test_beam_reorders_the_cache_of_each_sentence():
    """Several sentences in one batch (each its own model) give each one's result alone."""
    k, tables = 3, [make_table(seed, 1.0) for seed in (10, 11)]
    table = np.stack(tables)  # [2, TABLE, VOCAB]: sentence r's beams use tables[r]

    def batched_step(tokens, cache):
        history = jax.lax.dynamic_update_slice(cache["history"], tokens, (0, cache["t"]))
        index = jnp.sum(history * MULTIPLIERS, axis=1) % TABLE
        sentence = jnp.arange(history.shape[0]) // k
        return jnp.asarray(table)[sentence, index], {"t": cache["t"] + 1, "history": history}

    tokens, scores = beam(batched_step, toy_cache(2 * k), 2, LENGTH, beam_size=k)
    for r, table_r in enumerate(tables):
        expected, _, _ = reference_beam(table_r, k, 0.6, LENGTH)
        np.testing.assert_allclose(scores[r], [s for s, _ in expected], rtol=1e-5)


def test_min_len_and_ignoring_eos():
    table = make_table(3, eos_bias=6.0)  # EOS first almost everywhere
    step = toy_step(table)
    assert int(greedy(step, toy_cache(1), 1, LENGTH)[0, 0]) == EOS_ID
    held = np.asarray(greedy(step, toy_cache(1), 1, LENGTH, min_len=3))[0]
    assert EOS_ID not in held[:3] and held[3] == EOS_ID and np.all(held[4:] == PAD_ID)
    ignored = np.asarray(greedy(step, toy_cache(1), 1, LENGTH, eos_id=None))[0]
    assert PAD_ID not in ignored and np.count_nonzero(ignored == EOS_ID) >= 2
    tokens, _ = beam(step, toy_cache(2), 1, LENGTH, beam_size=2, min_len=3)
    expected, _, _ = reference_beam(table, 2, 0.6, LENGTH, min_len=3)
    np.testing.assert_array_equal(tokens[0, 0, : len(expected[0][1])], expected[0][1])
    assert EOS_ID not in np.asarray(tokens[0, :, :3])
    whole, _ = beam(step, toy_cache(2), 1, LENGTH, beam_size=2, eos_id=None)
    assert np.all(np.asarray(whole) != PAD_ID)  # every hypothesis runs to the limit
    limited = greedy(step, toy_cache(2), 2, LENGTH, eos_id=None, limits=jnp.array([2, 4]))
    np.testing.assert_array_equal(np.asarray(limited) != PAD_ID, np.arange(LENGTH) < [[2], [4]])


def test_beam_size_one_alpha_zero_is_greedy_and_prompts_are_forced():
    for seed in range(4):
        step = toy_step(make_table(seed, 0.5))
        g = greedy(step, toy_cache(1), 1, LENGTH)
        b, _ = beam(step, toy_cache(1), 1, LENGTH, beam_size=1, alpha=0.0)
        np.testing.assert_array_equal(b[:, 0], g)
    prompted = np.asarray(greedy(step, toy_cache(1), 1, LENGTH, prompt=jnp.array([[5, 6]])))
    np.testing.assert_array_equal(prompted[0, :2], [5, 6])
    np.testing.assert_array_equal(
        prompted[0, 2], np.argmax(toy_log_probs(make_table(3, 0.5), [5, 6]))
    )


def test_sampling_follows_the_tempered_distribution():
    table = make_table(5, 0.0)
    rows, temperature = 4000, 0.7
    step = toy_step(table)
    first = np.asarray(
        jax.jit(
            lambda key: sample(
                step, toy_cache(rows), rows, 1, key, temperature=temperature, eos_id=None
            )
        )(jax.random.key(0))
    )[:, 0]
    logits = toy_log_probs(table, []) / temperature
    expected = np.exp(logits - logits.max())
    expected /= expected.sum()
    counts = np.bincount(first, minlength=VOCAB) / rows
    np.testing.assert_allclose(counts, expected, atol=4 * math.sqrt(0.25 / rows))
    top2 = sample(step, toy_cache(rows), rows, 1, jax.random.key(1), top_k=2, eos_id=None)
    assert set(np.unique(np.asarray(top2))) == set(np.argsort(-expected)[:2].tolist())
    top1 = sample(step, toy_cache(3), 3, LENGTH, jax.random.key(2), top_k=1)
    np.testing.assert_array_equal(top1, greedy(step, toy_cache(3), 3, LENGTH))
    with pytest.raises(ValueError, match="temperature"):
        sample(step, toy_cache(1), 1, 2, jax.random.key(0), temperature=0.0)


def test_ensemble_is_the_mean_of_the_members_probabilities():
    fixed = lambda logits: lambda tokens, cache: (jnp.asarray([logits]), cache + 1)  # noqa: E731
    # softmax [0, log 3] = [1/4, 3/4] and its mirror image: the mean is [1/2, 1/2]
    step = ensemble([fixed([0.0, math.log(3.0)]), fixed([math.log(3.0), 0.0])])
    log_probs, caches = step(jnp.zeros((1, 1), jnp.int32), (0, 10))
    np.testing.assert_allclose(log_probs, [[-math.log(2.0)] * 2], rtol=1e-6)
    assert caches == (1, 11)
    alone, _ = ensemble([fixed([1.0, 2.0, 4.0])])(jnp.zeros((1, 1), jnp.int32), (0,))
    np.testing.assert_allclose(alone, jax.nn.log_softmax(jnp.array([[1.0, 2.0, 4.0]])), rtol=1e-6)
    with pytest.raises(ValueError, match="at least one"):
        ensemble([])


def test_ensemble_beam_equals_the_reference_on_mean_probabilities():
    k, differs = 3, 0
    for seed in range(4):
        tables = [make_table(seed, 1.0), make_table(seed + 50, 1.0)]
        expected, _, _ = reference_beam(tables, k, 0.6, LENGTH)
        step = ensemble([toy_step(table) for table in tables])
        tokens, scores = beam(step, (toy_cache(k), toy_cache(k)), 1, LENGTH, beam_size=k)
        np.testing.assert_allclose(scores[0], [s for s, _ in expected], rtol=1e-5)
        for row, (_, hypothesis) in zip(np.asarray(tokens[0]), expected, strict=True):
            np.testing.assert_array_equal(row[: len(hypothesis)], hypothesis)
        best = [reference_beam(table, k, 0.6, LENGTH)[0][0][1] for table in tables]
        differs += expected[0][1] not in best
    assert differs >= 1  # on some rows the ensemble's best is neither member's best


def test_gather_rows_per_leaf_axes():
    cache = {"a": jnp.arange(6).reshape(3, 2), "b": jnp.arange(6).reshape(2, 3), "n": 7}
    rows = jnp.array([2, 0, 0])
    out = gather_rows(cache, rows, {"a": 0, "b": 1, "n": None})
    np.testing.assert_array_equal(out["a"], np.arange(6).reshape(3, 2)[[2, 0, 0]])
    np.testing.assert_array_equal(out["b"], np.arange(6).reshape(2, 3)[:, [2, 0, 0]])
    assert out["n"] == 7
    assert gather_rows({"n": jnp.array(3)}, rows)["n"] == 3  # scalars are shared


def test_decoder_only_model_decodes_over_its_cache():
    """A decoder-only model (Decoder, no encoder): the cached step equals the full pass,
    cached greedy equals greedy by full passes, and its beam search runs on the cache."""
    cfg = TINY_CONFIG.replace(vocab_size=13, dropout_rate=0.0, max_len=12)
    model = Decoder(cfg)
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), jnp.ones((2, 6), jnp.int32))["params"])
    step = decoding.cached_step(Decoder(cfg.replace(decode=True)), params)
    cache = decoding.init_cache(Decoder(cfg.replace(decode=True)), 2, 8)
    prefix = jnp.array([[BOS_ID, 5, 9, 4, 7], [BOS_ID, 11, 6, 6, 8]])
    full = model.apply({"params": params}, prefix)
    for t in range(prefix.shape[1]):
        logits, cache = step(prefix[:, t : t + 1], cache)
        np.testing.assert_allclose(logits[:, 0], full[:, t], rtol=1e-5, atol=1e-5)

    run = jax.jit(
        lambda p: decoding.greedy(
            decoding.cached_step(Decoder(cfg.replace(decode=True)), p),
            decoding.init_cache(Decoder(cfg.replace(decode=True)), 2, 8),
            2,
            8,
            eos_id=None,
        )
    )
    cached = np.asarray(run(params))
    tokens = np.full((2, 1), BOS_ID)
    for _ in range(8):
        logits = np.array(model.apply({"params": params}, jnp.asarray(tokens)))[:, -1]
        logits[:, PAD_ID] = -np.inf
        tokens = np.concatenate([tokens, logits.argmax(-1)[:, None]], 1)
    np.testing.assert_array_equal(cached, tokens[:, 1:])

    k = 3
    beams, scores = decoding.beam(
        decoding.cached_step(Decoder(cfg.replace(decode=True)), params),
        decoding.init_cache(Decoder(cfg.replace(decode=True)), k, 5),
        1,
        5,
        beam_size=k,
    )
    # the best hypothesis' score is its log-probability under full passes, length-penalised
    best = np.asarray(beams[0, 0])
    length = int(np.flatnonzero(best == EOS_ID)[0]) + 1 if EOS_ID in best else 5
    tgt_in = jnp.asarray([[BOS_ID, *best[: length - 1]]])
    log_probs = jax.nn.log_softmax(
        model.apply({"params": params}, tgt_in).at[..., PAD_ID].set(-jnp.inf)
    )
    total = float(
        jnp.sum(jnp.take_along_axis(log_probs[0], jnp.asarray(best[:length])[:, None], 1))
    )
    np.testing.assert_allclose(
        float(scores[0, 0]), total / float(length_penalty(length, 0.6)), rtol=1e-5
    )
