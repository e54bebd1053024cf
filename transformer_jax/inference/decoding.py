"""Greedy and beam search over the decoder's KV cache (paper §6.1).

The source is encoded once; the decoder then runs one position per step inside a
jit-compiled :func:`jax.lax.while_loop`, reading and extending the MultiHeadAttention
KV cache. The encoder-decoder keys/values depend only on the encoder output, which is
loop-invariant: XLA hoists their projection out of the loop, so it runs once per call.
The loop ends when every sentence has finished or the longest allowed output is reached.

Output length: a sentence of ``n`` source tokens (its EOS included, padding excluded) may
produce at most ``n + max_extra_len`` tokens, the paper's "input length + 50"; a
per-sentence limit, so a sentence decodes the same alone as inside a padded batch. An
explicit ``max_len`` caps it further. Outputs are ``[batch, max_len]`` token ids after
BOS, EOS included when produced, PAD after it. PAD is never predicted.

Beam search follows the paper's (tensor2tensor's): beam size 4, length penalty
``lp(Y) = ((5 + |Y|) / 6) ** alpha`` with alpha = 0.6 (Wu et al. 2016, Eq. 14), scores
``log P(Y | X) / lp(Y)``, the 2k best extensions considered each step. Finished
hypotheses are kept apart from the k live ones: a candidate among the k best that ends in
EOS (or reaches the length limit) joins the k best finished (tensor2tensor admits EOS from
all 2k; the k-best rule makes beam size 1 with alpha = 0 exactly greedy search); the k
best candidates without EOS stay live. A sentence stops when no live hypothesis can still
beat its k-th finished one (tensor2tensor's bound: log-probabilities only fall and lp
is largest at the length limit).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from transformer_jax.data.tokenizer import BOS_ID, EOS_ID
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.transformer import Transformer

Array = jax.Array
NEG_INF = -jnp.inf


def length_penalty(length: Array, alpha: float) -> Array:
    """lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, Eq. 14)."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def greedy_search(
    config: TransformerConfig,
    params: Any,
    src: Array,
    *,
    max_len: int | None = None,
    max_extra_len: int = 50,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> Array:
    """Most probable next token at each step: int32 ``[batch, max_len]`` (see module doc).

    ``max_len`` defaults to ``src_len + max_extra_len`` (at most ``config.max_len``).
    """
    config, src, length = _check(config, src, max_len, max_extra_len, bos_id, eos_id)
    return _greedy(params, src, config, length, max_extra_len, bos_id, eos_id)


def beam_search(
    config: TransformerConfig,
    params: Any,
    src: Array,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len: int | None = None,
    max_extra_len: int = 50,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    return_all: bool = False,
) -> Array | tuple[Array, Array]:
    """Beam search with length penalty (paper §6.1; see module doc).

    Returns the best finished hypothesis per sentence, int32 ``[batch, max_len]``; with
    ``return_all`` the k best, ``([batch, k, max_len], scores [batch, k])``, best first
    (a slot no hypothesis reached has score -inf and only PAD).
    """
    if not isinstance(beam_size, int) or isinstance(beam_size, bool) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, got {beam_size!r}")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not alpha >= 0:
        raise ValueError(f"alpha must be a number >= 0, got {alpha!r}")
    config, src, length = _check(config, src, max_len, max_extra_len, bos_id, eos_id)
    tokens, scores = _beam(
        params, src, config, length, max_extra_len, bos_id, eos_id, beam_size, float(alpha)
    )
    return (tokens, scores) if return_all else tokens[:, 0]


# ---------------------------------------------------------------------------- checks
def _check(
    config: TransformerConfig,
    src: Any,
    max_len: int | None,
    max_extra_len: int,
    bos_id: int,
    eos_id: int,
) -> tuple[TransformerConfig, Array, int]:
    """Validate arguments; return the config decoding is compiled for, src, output length."""
    src = jnp.asarray(src)
    if src.ndim != 2 or not jnp.issubdtype(src.dtype, jnp.integer) or src.shape[1] == 0:
        raise ValueError(
            f"src must be integer token ids [batch, length >= 1], got {src.shape} {src.dtype}"
        )
    if src.shape[1] > config.max_len:
        raise ValueError(f"src length {src.shape[1]} exceeds config.max_len={config.max_len}")
    if not isinstance(max_extra_len, int) or max_extra_len < 0:
        raise ValueError(f"max_extra_len must be an integer >= 0, got {max_extra_len!r}")
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        if not isinstance(value, int) or not 0 <= value < config.tgt_vocab:
            raise ValueError(f"{name} must be a token id in [0, {config.tgt_vocab}), got {value!r}")
    if eos_id == config.pad_id:
        raise ValueError(f"eos_id must differ from config.pad_id={config.pad_id}")
    if max_len is None:
        max_len = min(src.shape[1] + max_extra_len, config.max_len)
    elif not isinstance(max_len, int) or not 1 <= max_len <= config.max_len:
        raise ValueError(
            f"max_len must be an integer in [1, config.max_len={config.max_len}], got {max_len!r}"
        )
    config = config.replace(decode=False, sow_attention_weights=False)
    return config, src.astype(jnp.int32), max_len


# ------------------------------------------------------------------------ shared parts
def _start(
    params: Any, src: Array, config: TransformerConfig, max_len: int, max_extra_len: int, k: int
) -> tuple[Transformer, Array, Array, Any, Array]:
    """Encode once; expand by beam; empty cache; per-sentence output-length limits."""
    model = Transformer(config.replace(decode=True))
    encoded = model.apply({"params": params}, src, method="encode")
    limits = jnp.minimum(jnp.sum(src != config.pad_id, axis=1) + max_extra_len, max_len)
    encoded, src = jnp.repeat(encoded, k, axis=0), jnp.repeat(src, k, axis=0)
    target = jnp.zeros((src.shape[0], max_len), jnp.int32)  # sizes the self-attention cache
    cache = model.init(jax.random.key(0), src, target)["cache"]  # zeros; its params are unused
    return model, encoded, src, cache, limits


def _log_probs(
    model: Transformer, params: Any, cache: Any, encoded: Array, src: Array, last: Array
) -> tuple[Array, Any]:
    """log P(next token) ``[rows, vocab]`` (PAD excluded) and the extended cache."""
    logits, state = model.apply(
        {"params": params, "cache": cache},
        encoded,
        src,
        last[:, None],
        method="decode",
        mutable=["cache"],
    )
    logits = logits[:, 0].at[:, model.config.pad_id].set(NEG_INF)
    return jax.nn.log_softmax(logits), state["cache"]


# ---------------------------------------------------------------------------- greedy
@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5, 6))
def _greedy(
    params: Any,
    src: Array,
    config: TransformerConfig,
    max_len: int,
    max_extra_len: int,
    bos_id: int,
    eos_id: int,
) -> Array:
    model, encoded, src, cache, limits = _start(params, src, config, max_len, max_extra_len, 1)
    batch = src.shape[0]
    pad = config.pad_id

    def cond(state):
        t, _, _, done, _ = state
        return (t < max_len) & ~jnp.all(done)

    def body(state):
        t, tokens, last, done, cache = state
        log_probs, cache = _log_probs(model, params, cache, encoded, src, last)
        token = jnp.where(done, pad, jnp.argmax(log_probs, axis=-1).astype(jnp.int32))
        tokens = tokens.at[:, t].set(token)
        done = done | (token == eos_id) | (t + 1 >= limits)
        return t + 1, tokens, token, done, cache

    state = (
        jnp.array(0),
        jnp.full((batch, max_len), pad, jnp.int32),
        jnp.full((batch,), bos_id, jnp.int32),
        jnp.zeros((batch,), bool),
        cache,
    )
    return jax.lax.while_loop(cond, body, state)[1]


# ------------------------------------------------------------------------------ beam
@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5, 6, 7, 8))
def _beam(
    params: Any,
    src: Array,
    config: TransformerConfig,
    max_len: int,
    max_extra_len: int,
    bos_id: int,
    eos_id: int,
    k: int,
    alpha: float,
) -> tuple[Array, Array]:
    model, encoded, src, cache, limits = _start(params, src, config, max_len, max_extra_len, k)
    batch = limits.shape[0]
    pad = config.pad_id
    best_possible = lambda log_prob: log_prob / length_penalty(limits, alpha)  # noqa: E731
    take = lambda x, i: jnp.take_along_axis(x, i.reshape(i.shape + (1,) * (x.ndim - 2)), 1)  # noqa: E731

    def cond(state):
        return (state[0] <= max_len) & ~jnp.all(state[-1])

    def body(state):
        t, live, live_log_prob, finished, finished_score, cache, done = state
        log_probs, cache = _log_probs(model, params, cache, encoded, src, live[:, :, t - 1].ravel())
        vocab = log_probs.shape[-1]
        candidates = (live_log_prob[:, :, None] + log_probs.reshape(batch, k, vocab)).reshape(
            batch, k * vocab
        )
        log_prob, index = jax.lax.top_k(candidates, 2 * k)  # [batch, 2k], best first
        origin, token = index // vocab, (index % vocab).astype(jnp.int32)
        sequences = take(live, origin).at[:, :, t].set(token)  # [batch, 2k, 1 + max_len]
        ends = (token == eos_id) | (t >= limits)[:, None]

        # Finished: ending candidates among the k best join the k best finished so far.
        new_score = log_prob / length_penalty(t, alpha)
        keep = ends & (jnp.arange(2 * k) < k) & ~done[:, None]
        scores = jnp.concatenate([finished_score, jnp.where(keep, new_score, NEG_INF)], 1)
        finished_score, best = jax.lax.top_k(scores, k)
        finished = take(jnp.concatenate([finished, sequences], 1), best)

        # Live: the k best candidates that did not end; reorder the cache rows to match.
        live_log_prob, best = jax.lax.top_k(jnp.where(ends, NEG_INF, log_prob), k)
        live = take(sequences, best)
        rows = (jnp.arange(batch)[:, None] * k + take(origin, best)).ravel()
        cache = _reorder(cache, rows)

        done = done | (t >= limits) | (finished_score[:, -1] >= best_possible(live_log_prob[:, 0]))
        return t + 1, live, live_log_prob, finished, finished_score, cache, done

    # Column 0 of the sequences holds BOS; step t writes column t. One live beam at first.
    sequences = jnp.full((batch, k, 1 + max_len), pad, jnp.int32).at[:, :, 0].set(bos_id)
    first = jnp.where(jnp.arange(k) == 0, 0.0, NEG_INF)
    state = (
        jnp.array(1),
        sequences,
        jnp.broadcast_to(first, (batch, k)),
        sequences,
        jnp.full((batch, k), NEG_INF),
        cache,
        jnp.zeros((batch,), bool),
    )
    _, _, _, finished, finished_score, _, _ = jax.lax.while_loop(cond, body, state)
    finished = jnp.where(finished_score[:, :, None] > NEG_INF, finished[:, :, 1:], pad)
    return finished, finished_score


def _reorder(cache: Any, rows: Array) -> Any:
    """Gather the self-attention cache rows of the surviving beams.

    Counters (scalars) are shared; the encoder-decoder keys/values are the same for all
    beams of a sentence, so they are left in place. Caches of scanned layers
    (``scan_layers``) have a leading layer axis.
    """

    def gather(path, x):
        keys = [getattr(p, "key", None) for p in path]
        batch_axis = int("layers" in keys)
        if x.ndim == batch_axis or "cross_attention" in keys:
            return x
        return jnp.take(x, rows, axis=batch_axis)

    return jax.tree_util.tree_map_with_path(gather, cache)
