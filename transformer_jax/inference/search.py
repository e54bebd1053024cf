"""Greedy search, beam search and sampling over any step function (paper §6.1).

A step function maps the last token of each row and a cache to the next-token logits
and the extended cache::

    step_fn(tokens: int32 [rows, 1], cache) -> (logits [rows, vocab] or [rows, 1, vocab], cache)

``cache`` is any pytree: the ``'cache'`` collection of a Flax module built with
``decode=True`` (:func:`cached_step` makes the step function of such a module), or
whatever the caller keeps. Beam search reorders it generically: every array leaf is
gathered along its batch axis (``cache_batch_axis``; leaves with no such axis, such as
step counters, are shared by all rows). The searches run one position per iteration of a
:func:`jax.lax.while_loop` and stop when every row has finished; call them under
:func:`jax.jit` (the step function is traced once).

Outputs are int32 ``[batch, max_len]``: the tokens after the first input token, EOS
included when produced, ``pad_id`` after it. ``pad_id`` is never predicted. Row ``i``
produces at most ``limits[i]`` tokens (default ``max_len``); ``min_len`` tokens come
before EOS can end a row; ``eos_id=None`` ignores EOS (every row runs to its limit).

Beam search follows the paper's (tensor2tensor's): length penalty ``lp(Y) = ((5 + |Y|) /
6) ** alpha`` (Wu et al. 2016, Eq. 14), scores ``log P(Y) / lp(Y)``, the 2k best
extensions considered each step. Finished hypotheses are kept apart from the k live
ones: a candidate among the k best that ends in EOS (or reaches the length limit) joins
the k best finished (tensor2tensor admits EOS from all 2k; the k-best rule makes beam
size 1 with alpha = 0 exactly greedy search); the k best candidates without EOS stay
live. A row stops when no live hypothesis can still beat its k-th finished one
(tensor2tensor's bound: log-probabilities only fall and lp is largest at the limit).

:func:`ensemble` combines several models' step functions into one, whose next-token
distribution is the mean of theirs; every search above decodes with it unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.ids import BOS_ID, EOS_ID, PAD_ID
from transformer_jax.inference.config import PAPER

Array = jax.Array
StepFn = Callable[[Array, Any], tuple[Array, Any]]
NEG_INF = -jnp.inf


def length_penalty(length: Array, alpha: float) -> Array:
    """lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, Eq. 14)."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def cached_step(module: nn.Module, params: Any, method: str | None = None, **kwargs: Any) -> StepFn:
    """The step function of a Flax module that keeps a ``'cache'`` collection.

    ``module.apply({'params': params, 'cache': cache}, tokens, **kwargs, method=method,
    mutable=['cache'])``; ``module`` is built for one position per call (``decode=True``).
    """

    def step(tokens: Array, cache: Any) -> tuple[Array, Any]:
        logits, state = module.apply(
            {"params": params, "cache": cache}, tokens, **kwargs, method=method, mutable=["cache"]
        )
        return logits, state["cache"]

    return step


def init_cache(module: nn.Module, rows: int, max_len: int, *args: Any, **kwargs: Any) -> Any:
    """The empty (zero) cache of ``module`` for ``rows`` sequences of up to ``max_len``
    positions: the shapes of ``module.init(key, tokens[rows, max_len], *args, **kwargs)``.
    """
    tokens = jnp.zeros((rows, max_len), jnp.int32)
    shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), tokens, *args, **kwargs))
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes["cache"])


def gather_rows(cache: Any, rows: Array, batch_axis: int | Any = 0) -> Any:
    """``cache`` with its rows ``rows`` along each leaf's batch axis.

    ``batch_axis``: one axis for every leaf (leaves with no more dimensions than it are
    left as they are), or a pytree of the cache's structure with an axis or ``None``
    (shared) per leaf.
    """
    if isinstance(batch_axis, int):
        return jax.tree.map(
            lambda x: x if x.ndim <= batch_axis else jnp.take(x, rows, axis=batch_axis), cache
        )
    return jax.tree.map(
        lambda axis, x: x if axis is None else jnp.take(x, rows, axis=axis),
        batch_axis,
        cache,
        is_leaf=lambda a: a is None,
    )


def ensemble(step_fns: Sequence[StepFn]) -> StepFn:
    """The step function of an ensemble of models over the tuple of their caches.

    Its output is the log of the mean of the members' next-token probabilities,
    ``log(1/n * sum_i softmax(logits_i))``: normalized log-probabilities, as the searches
    expect. All members must share one target vocabulary.
    """
    step_fns = tuple(step_fns)
    if not step_fns:
        raise ValueError("an ensemble needs at least one step function")

    def step(tokens: Array, caches: Any) -> tuple[Array, Any]:
        outputs = [fn(tokens, cache) for fn, cache in zip(step_fns, caches, strict=True)]
        log_probs = [jax.nn.log_softmax(logits.astype(jnp.float32)) for logits, _ in outputs]
        mean = jax.nn.logsumexp(jnp.stack(log_probs), axis=0) - math.log(len(step_fns))
        return mean, tuple(cache for _, cache in outputs)

    return step


def _logits(step_fn: StepFn, tokens: Array, cache: Any) -> tuple[Array, Any]:
    logits, cache = step_fn(tokens[:, None], cache)
    if logits.ndim == 3:
        logits = logits[:, -1]
    return logits.astype(jnp.float32), cache


def _ban(logits: Array, t: Array, pad_id: int | None, eos_id: int | None, min_len: int) -> Array:
    """PAD is never predicted; EOS not before ``min_len`` tokens."""
    vocab = jnp.arange(logits.shape[-1])
    banned = jnp.zeros(logits.shape[-1], bool)
    if pad_id is not None:
        banned |= vocab == pad_id
    if eos_id is not None and min_len > 0:
        banned |= (vocab == eos_id) & (t < min_len)
    return jnp.where(banned, NEG_INF, logits)


def _limits(batch: int, max_len: int, limits: Array | None) -> Array:
    if limits is None:
        return jnp.full((batch,), max_len, jnp.int32)
    return jnp.minimum(jnp.asarray(limits, jnp.int32), max_len)


def greedy(
    step_fn: StepFn,
    cache: Any,
    batch: int,
    max_len: int,
    *,
    bos_id: int = BOS_ID,
    eos_id: int | None = EOS_ID,
    pad_id: int | None = PAD_ID,
    min_len: int = 0,
    limits: Array | None = None,
    prompt: Array | None = None,
) -> Array:
    """The most probable next token at each step (module doc): int32 ``[batch, max_len]``.

    ``prompt`` (int ``[batch, p]``): tokens forced at the first ``p`` positions (they
    appear in the output); the search continues after them.
    """
    args = (bos_id, eos_id, pad_id, min_len, limits, prompt)
    return _choose(step_fn, cache, batch, max_len, None, *args)


def sample(
    step_fn: StepFn,
    cache: Any,
    batch: int,
    max_len: int,
    key: Array,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    bos_id: int = BOS_ID,
    eos_id: int | None = EOS_ID,
    pad_id: int | None = PAD_ID,
    min_len: int = 0,
    limits: Array | None = None,
    prompt: Array | None = None,
) -> Array:
    """Each next token drawn from softmax(logits / temperature), restricted to the
    ``top_k`` most probable when given (module doc): int32 ``[batch, max_len]``.

    ``key``: the random key (step ``t`` uses ``fold_in(key, t)``); ``prompt`` as in
    :func:`greedy`.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")

    def draw(logits: Array, t: Array) -> Array:
        logits = logits / temperature
        if top_k is not None and top_k < logits.shape[-1]:
            kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
            logits = jnp.where(logits >= kth, logits, NEG_INF)
        return jax.random.categorical(jax.random.fold_in(key, t), logits)

    args = (bos_id, eos_id, pad_id, min_len, limits, prompt)
    return _choose(step_fn, cache, batch, max_len, draw, *args)


def _choose(
    step_fn: StepFn,
    cache: Any,
    batch: int,
    max_len: int,
    draw: Callable[[Array, Array], Array] | None,
    bos_id: int,
    eos_id: int | None,
    pad_id: int | None,
    min_len: int,
    limits: Array | None,
    prompt: Array | None,
) -> Array:
    """One token per row and step: ``draw(logits, t)``, or the argmax when ``draw`` is None."""
    limits = _limits(batch, max_len, limits)
    fill = PAD_ID if pad_id is None else pad_id
    forced = jnp.zeros((batch, 0), jnp.int32) if prompt is None else jnp.asarray(prompt, jnp.int32)

    def cond(state):
        t, _, _, done, _ = state
        return (t < max_len) & ~jnp.all(done)

    def body(state):
        t, tokens, last, done, cache = state
        logits, cache = _logits(step_fn, last, cache)
        logits = _ban(logits, t, pad_id, eos_id, min_len)
        token = jnp.argmax(logits, axis=-1) if draw is None else draw(logits, t)
        if forced.shape[1]:
            given = jax.lax.dynamic_index_in_dim(forced, jnp.minimum(t, forced.shape[1] - 1), 1)
            token = jnp.where(t < forced.shape[1], given[:, 0], token)
        token = jnp.where(done, fill, token.astype(jnp.int32))
        tokens = tokens.at[:, t].set(token)
        ended = (t + 1 >= limits) if eos_id is None else (token == eos_id) | (t + 1 >= limits)
        return t + 1, tokens, token, done | ended, cache

    state = (
        jnp.array(0),
        jnp.full((batch, max_len), fill, jnp.int32),
        jnp.full((batch,), bos_id, jnp.int32),
        limits <= 0,
        cache,
    )
    return jax.lax.while_loop(cond, body, state)[1]


def beam(
    step_fn: StepFn,
    cache: Any,
    batch: int,
    max_len: int,
    *,
    beam_size: int = PAPER.beam_size,
    alpha: float = PAPER.alpha,
    bos_id: int = BOS_ID,
    eos_id: int | None = EOS_ID,
    pad_id: int | None = PAD_ID,
    min_len: int = 0,
    limits: Array | None = None,
    cache_batch_axis: int | Any = 0,
) -> tuple[Array, Array]:
    """Beam search with length penalty (module doc).

    ``cache`` holds ``batch * beam_size`` rows, sentence ``i``'s beams at rows
    ``i * beam_size ...`` (e.g. inputs repeated with ``jnp.repeat(x, beam_size, 0)``);
    ``cache_batch_axis`` as in :func:`gather_rows`.

    Returns the k best finished hypotheses per row, best first: int32
    ``[batch, beam_size, max_len]`` and their scores ``[batch, beam_size]`` (a slot no
    hypothesis reached has score -inf and only PAD).
    """
    k = beam_size
    limits = _limits(batch, max_len, limits)
    fill = PAD_ID if pad_id is None else pad_id
    best_possible = lambda log_prob: log_prob / length_penalty(limits, alpha)  # noqa: E731
    take = lambda x, i: jnp.take_along_axis(x, i.reshape(i.shape + (1,) * (x.ndim - 2)), 1)  # noqa: E731

    def cond(state):
        return (state[0] <= max_len) & ~jnp.all(state[-1])

    def body(state):
        t, live, live_log_prob, finished, finished_score, cache, done = state
        logits, cache = _logits(step_fn, live[:, :, t - 1].ravel(), cache)
        log_probs = jax.nn.log_softmax(_ban(logits, t - 1, pad_id, eos_id, min_len))
        vocab = log_probs.shape[-1]
        candidates = (live_log_prob[:, :, None] + log_probs.reshape(batch, k, vocab)).reshape(
            batch, k * vocab
        )
        log_prob, index = jax.lax.top_k(candidates, 2 * k)  # [batch, 2k], best first
        origin, token = index // vocab, (index % vocab).astype(jnp.int32)
        sequences = take(live, origin).at[:, :, t].set(token)  # [batch, 2k, 1 + max_len]
        ends = (t >= limits)[:, None]
        if eos_id is not None:
            ends = ends | (token == eos_id)

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
        cache = gather_rows(cache, rows, cache_batch_axis)

        done = done | (t >= limits) | (finished_score[:, -1] >= best_possible(live_log_prob[:, 0]))
        return t + 1, live, live_log_prob, finished, finished_score, cache, done

    # Column 0 of the sequences holds BOS; step t writes column t. One live beam at first.
    sequences = jnp.full((batch, k, 1 + max_len), fill, jnp.int32).at[:, :, 0].set(bos_id)
    first = jnp.where(jnp.arange(k) == 0, 0.0, NEG_INF)
    state = (
        jnp.array(1),
        sequences,
        jnp.broadcast_to(first, (batch, k)),
        sequences,
        jnp.full((batch, k), NEG_INF),
        cache,
        limits <= 0,
    )
    _, _, _, finished, finished_score, _, _ = jax.lax.while_loop(cond, body, state)
    finished = jnp.where(finished_score[:, :, None] > NEG_INF, finished[:, :, 1:], fill)
    return finished, finished_score
