"""Decoding: the searches over any step function, and their use with the encoder-decoder
Transformer (paper §6.1).

The generic searches (:mod:`transformer_jax.inference.search`) are re-exported here:
:func:`greedy`, :func:`beam`, :func:`sample` over a step function ``(tokens, cache) ->
(logits, cache)``, with :func:`cached_step` and :func:`init_cache` for a Flax module that
keeps a KV cache (e.g. a decoder-only ``Decoder(config.replace(decode=True))``).

For the Transformer, :func:`greedy_search`, :func:`beam_search` and
:func:`temperature_sample` take ``(model, params, src)``: ``model`` a
:class:`~transformer_jax.model.transformer.Transformer` module (with whatever pieces it was
given) or a ``TransformerConfig`` (the paper's ``Transformer(config)``); ``params`` may also be
a list of parameter trees (with one model, or a list of them), an ensemble whose next-token
distribution is the mean of its models' (:func:`ensemble`). The source is encoded once,
then the decoder runs one position per step over its KV cache inside one jit-compiled
loop. The encoder-decoder keys and values depend only on the encoder output, which is
loop-invariant: XLA computes their projections once per call, before the loop.

Output length: a sentence of ``n`` source tokens (its EOS included, padding excluded) may
produce at most ``n + max_extra_len`` tokens, the paper's "input length + 50"; a
per-sentence limit, so a sentence decodes the same alone as inside a padded batch. An
explicit ``max_len`` caps it further. Outputs are ``[batch, max_len]`` token ids after
BOS, EOS included when produced, PAD after it. PAD is never predicted. Beam search uses
beam size 4 and length penalty alpha 0.6 by default (the paper's).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import flax
import flax.linen
import jax
import jax.numpy as jnp

from transformer_jax.ids import BOS_ID, EOS_ID
from transformer_jax.inference.config import PAPER
from transformer_jax.inference.search import (
    StepFn,
    beam,
    cached_step,
    ensemble,
    gather_rows,
    greedy,
    init_cache,
    length_penalty,
    sample,
)
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.embeddings import check_tokens
from transformer_jax.model.transformer import Transformer

Array = jax.Array
Model = Transformer | TransformerConfig
Models = Model | Sequence[Model]

__all__ = [
    "StepFn",
    "beam",
    "beam_search",
    "cached_step",
    "ensemble",
    "gather_rows",
    "greedy",
    "greedy_search",
    "as_model",
    "check_params",
    "init_cache",
    "length_penalty",
    "sample",
    "temperature_sample",
    "transformer_step",
]


def greedy_search(
    config: Models,
    params: Any,
    src: Array,
    *,
    max_len: int | None = None,
    max_extra_len: int = PAPER.max_extra_len,
    min_len: int = 0,
    bos_id: int = BOS_ID,
    eos_id: int | None = EOS_ID,
) -> Array:
    """The most probable next token at each step: int32 ``[batch, max_len]``.

    Args:
      config, params: the Transformer (module or config), or an ensemble (module doc); src: int
        ``[batch, src_len]`` source ids + EOS, PAD.
      max_len: output width (default ``src_len + max_extra_len``, at most ``config.max_len``).
      max_extra_len: each sentence's output limit is its source length + this.
      min_len: tokens before EOS may end a sentence; eos_id: ``None`` ignores EOS.
    """
    models, params = _members(config, params)
    models, src, max_len = _check(models, src, max_len, max_extra_len, min_len, bos_id, eos_id)
    return _greedy(params, src, models, max_len, max_extra_len, min_len, bos_id, eos_id)


def beam_search(
    config: Models,
    params: Any,
    src: Array,
    *,
    beam_size: int = PAPER.beam_size,
    alpha: float = PAPER.alpha,
    max_len: int | None = None,
    max_extra_len: int = PAPER.max_extra_len,
    min_len: int = 0,
    bos_id: int = BOS_ID,
    eos_id: int | None = EOS_ID,
    return_all: bool = False,
) -> Array | tuple[Array, Array]:
    """Beam search with length penalty (paper §6.1; :func:`beam`).

    Arguments as :func:`greedy_search`, plus ``beam_size`` and ``alpha``. Returns the best
    finished hypothesis per sentence, int32 ``[batch, max_len]``; with ``return_all`` the
    k best, ``([batch, k, max_len], scores [batch, k])``, best first (a slot no hypothesis
    reached has score -inf and only PAD).
    """
    if not isinstance(beam_size, int) or isinstance(beam_size, bool) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, got {beam_size!r}")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not alpha >= 0:
        raise ValueError(f"alpha must be a number >= 0, got {alpha!r}")
    models, params = _members(config, params)
    models, src, max_len = _check(models, src, max_len, max_extra_len, min_len, bos_id, eos_id)
    settings = (max_len, max_extra_len, min_len, bos_id, eos_id, beam_size, float(alpha))
    tokens, scores = _beam(params, src, models, *settings)
    return (tokens, scores) if return_all else tokens[:, 0]


def temperature_sample(
    config: Models,
    params: Any,
    src: Array,
    key: Array,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    max_len: int | None = None,
    max_extra_len: int = PAPER.max_extra_len,
    min_len: int = 0,
    bos_id: int = BOS_ID,
    eos_id: int | None = EOS_ID,
) -> Array:
    """Translations sampled token by token from softmax(logits / temperature), among the
    ``top_k`` most probable tokens when given (:func:`sample`); other arguments as
    :func:`greedy_search`. Returns int32 ``[batch, max_len]``."""
    if not isinstance(temperature, int | float) or not temperature > 0:
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    models, params = _members(config, params)
    models, src, max_len = _check(models, src, max_len, max_extra_len, min_len, bos_id, eos_id)
    settings = (max_len, max_extra_len, min_len, bos_id, eos_id, float(temperature), top_k)
    return _sample(params, src, key, models, *settings)


def transformer_step(
    config: Model, params: Any, src: Array, max_len: int, copies: int = 1
) -> tuple[StepFn, Any]:
    """The Transformer's (module's, or config's) step function over ``src`` and its empty cache.

    Encodes ``src`` once; each row is repeated ``copies`` times (the beams of beam
    search), and the cache holds ``max_len`` decoder positions.
    """
    model = as_model(config, decode=True)
    encoded = model.apply({"params": params}, src, method="encode")
    encoded, src = jnp.repeat(encoded, copies, axis=0), jnp.repeat(src, copies, axis=0)
    target = jnp.zeros((src.shape[0], max_len), jnp.int32)  # sizes the self-attention cache
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), src, target)["cache"])
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def step(tokens: Array, cache: Any) -> tuple[Array, Any]:
        logits, state = model.apply(
            {"params": params, "cache": cache},
            encoded,
            src,
            tokens,
            method="decode",
            mutable=["cache"],
        )
        return logits, state["cache"]

    return step, cache


# ---------------------------------------------------------------------------- checks
def as_model(model: Model, decode: bool = False) -> Transformer:
    """``model`` (a ``Transformer(config)`` for a config) with ``config.decode=decode`` and no
    sown weights: the module decoding runs."""
    if isinstance(model, TransformerConfig):
        model = Transformer(model)
    if not isinstance(getattr(model, "config", None), TransformerConfig):
        raise ValueError(
            f"expected a Transformer module or a TransformerConfig, got {type(model).__name__}"
        )
    return model.clone(config=model.config.replace(decode=decode, sow_attention_weights=False))


@functools.lru_cache(maxsize=64)
def _param_shapes(model: Transformer) -> dict[tuple[str, ...], tuple[int, ...]]:
    tokens = jnp.zeros((1, 1), jnp.int32)
    shapes = flax.linen.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens, tokens))
    return {k: v.shape for k, v in flax.traverse_util.flatten_dict(shapes["params"]).items()}


def check_params(model: Transformer, params: Any) -> None:
    """``params`` must be the parameter tree of ``model`` (a ``decode=False`` Transformer):
    a ``ValueError`` names the first differing entry."""
    want = _param_shapes(model)
    got = flax.traverse_util.flatten_dict(flax.core.unfreeze(flax.linen.unbox(params)))
    for path in sorted(want.keys() | got.keys()):
        name = "/".join(map(str, path))
        if path not in got:
            problem = f"has no {name!r}"
        elif path not in want:
            problem = f"has {name!r}, which the model has not"
        elif tuple(jnp.shape(got[path])) != want[path]:
            problem = f"{name!r} is {tuple(jnp.shape(got[path]))}, the model's {want[path]}"
        else:
            continue
        cfg = model.config
        raise ValueError(
            f"params do not match the model (d_model={cfg.d_model}, layers "
            f"{cfg.num_encoder_layers}+{cfg.num_decoder_layers}, vocab {cfg.vocab_size}): "
            f"the tree {problem}"
        )


def _members(config: Models, params: Any) -> tuple[tuple[Transformer, ...], tuple[Any, ...]]:
    """The models decoded together: one, or an ensemble when ``params`` is a list or tuple
    of parameter trees (``config`` one model or config for all of them, or one each)."""
    ensemble_of = isinstance(params, list | tuple)
    params = tuple(params) if ensemble_of else (params,)
    one = not isinstance(config, list | tuple)
    if not ensemble_of and not one:
        raise ValueError("config must be a TransformerConfig (or Transformer) for one model")
    models = tuple(as_model(c) for c in ((config,) * len(params) if one else config))
    if not params or len(models) != len(params):
        raise ValueError(
            f"an ensemble needs one or more models and a config for each: got {len(params)} "
            f"parameter trees and {len(models)} configs"
        )
    for field in ("tgt_vocab", "pad_id", "max_len"):
        values = sorted({getattr(m.config, field) for m in models})
        if len(values) > 1:
            raise ValueError(f"the ensemble's models differ in config.{field}: {values}")
    for model, tree in zip(models, params, strict=True):
        check_params(model, tree)
    return models, params


def _check(
    models: tuple[Transformer, ...],
    src: Any,
    max_len: int | None,
    max_extra_len: int,
    min_len: int,
    bos_id: int,
    eos_id: int | None,
) -> tuple[tuple[Transformer, ...], Array, int]:
    """Validate arguments; return the models decoding is compiled for, src, output length."""
    config = models[0].config  # the fields checked here are equal in every member (_members)
    src = jnp.asarray(src)
    if src.ndim != 2 or not jnp.issubdtype(src.dtype, jnp.integer) or src.shape[1] == 0:
        raise ValueError(
            f"src must be integer token ids [batch, length >= 1], got {src.shape} {src.dtype}"
        )
    if src.shape[1] > config.max_len:
        raise ValueError(f"src length {src.shape[1]} exceeds config.max_len={config.max_len}")
    for name, value in (("max_extra_len", max_extra_len), ("min_len", min_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    ids = (("bos_id", bos_id),) + ((("eos_id", eos_id),) if eos_id is not None else ())
    for name, value in ids:
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
    if not isinstance(src, jax.core.Tracer):
        check_tokens("src", src, config.src_vocab)
    return models, src.astype(jnp.int32), max_len


def _options(
    src: Array,
    config: TransformerConfig,
    max_len: int,
    max_extra_len: int,
    min_len: int,
    bos_id: int,
    eos_id: int | None,
) -> dict[str, Any]:
    """The searches' keyword arguments; each sentence's output limit is its source length
    (padding excluded) + ``max_extra_len``."""
    limits = jnp.minimum(jnp.sum(src != config.pad_id, axis=1) + max_extra_len, max_len)
    return dict(bos_id=bos_id, eos_id=eos_id, pad_id=config.pad_id, min_len=min_len, limits=limits)


# ------------------------------------------------------------------- compiled searches
def _step(
    models: tuple[Transformer, ...],
    params: tuple[Any, ...],
    src: Array,
    max_len: int,
    copies: int = 1,
) -> tuple[StepFn, Any, Any]:
    """The step function, cache and cache batch axis (scanned layers: ``[layers, rows, ...]``)
    of one model, or of an ensemble (its caches a tuple, with one axis per leaf)."""
    axes = [1 if m.config.scan_layers else 0 for m in models]
    members = [
        transformer_step(m, p, src, max_len, copies) for m, p in zip(models, params, strict=True)
    ]
    if len(members) == 1:
        return (*members[0], axes[0])
    caches = tuple(cache for _, cache in members)
    per_leaf = tuple(  # None: a leaf with no batch axis (a position counter), shared
        jax.tree.map(lambda x, a=a: a if x.ndim > a else None, cache)
        for a, cache in zip(axes, caches, strict=True)
    )
    return ensemble([step for step, _ in members]), caches, per_leaf


@functools.partial(jax.jit, static_argnums=tuple(range(2, 8)))
def _greedy(params, src, models, max_len, max_extra_len, min_len, bos_id, eos_id) -> Array:
    step, cache, _ = _step(models, params, src, max_len)
    options = _options(src, models[0].config, max_len, max_extra_len, min_len, bos_id, eos_id)
    return greedy(step, cache, src.shape[0], max_len, **options)


@functools.partial(jax.jit, static_argnums=tuple(range(2, 10)))
def _beam(
    params, src, models, max_len, max_extra_len, min_len, bos_id, eos_id, k, alpha
) -> tuple[Array, Array]:
    step, cache, axes = _step(models, params, src, max_len, copies=k)
    options = _options(src, models[0].config, max_len, max_extra_len, min_len, bos_id, eos_id)
    return beam(
        step,
        cache,
        src.shape[0],
        max_len,
        beam_size=k,
        alpha=alpha,
        cache_batch_axis=axes,
        **options,
    )


@functools.partial(jax.jit, static_argnums=tuple(range(3, 11)))
def _sample(
    params, src, key, models, max_len, max_extra_len, min_len, bos_id, eos_id, temperature, top_k
) -> Array:
    step, cache, _ = _step(models, params, src, max_len)
    options = _options(src, models[0].config, max_len, max_extra_len, min_len, bos_id, eos_id)
    return sample(
        step, cache, src.shape[0], max_len, key, temperature=temperature, top_k=top_k, **options
    )
