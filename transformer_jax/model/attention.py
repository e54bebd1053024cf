"""Scaled dot-product attention, multi-head attention and its KV cache (paper §3.2).

Layout conventions: inside attention arrays are ``[batch, length, heads, head_dim]``
(the layout of :func:`jax.nn.dot_product_attention`); keys and values may have fewer heads
than the queries, each shared by a group of them (grouped-query attention); masks
(:mod:`transformer_jax.model.masks`, also importable from here) are boolean with ``True`` =
may attend, broadcastable to ``[batch, heads, q_len, kv_len]``. :func:`kv_cache` is the
decoding cache any attention module keeps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax import kernels as _kernels
from transformer_jax.model.masks import (
    causal_mask,
    check_mask,
    combine_masks,
    padding_mask,
    segment_mask,
)
from transformer_jax.model.partitioning import logical
from transformer_jax.options import ATTENTION_IMPLS

__all__ = [  # the masks too, from transformer_jax.model.masks
    "MultiHeadAttention",
    "ScoreFn",
    "Where",
    "attention_weights",
    "causal_mask",
    "check_mask",
    "combine_masks",
    "grouped",
    "kv_cache",
    "padding_mask",
    "scaled_dot_product_attention",
    "segment_mask",
]
Array = jax.Array
ScoreFn = Callable[..., Array]
"""``score_fn(q, k, where, dot) -> scores``: the attention scores, float32
``[batch, heads, q_len, kv_len]`` before masking and softmax. ``q`` and ``k`` are
``[batch, length, heads, d_k]``; ``where`` is :class:`Where` (absolute positions and segment
ids); ``dot(q, k)`` is the paper's Q K^T / sqrt(d_k) (Eq. 1) at the model's precision."""


@flax.struct.dataclass
class Where:
    """What a score hook knows of its queries and keys: absolute positions, int
    ``[batch or 1, q_len]`` / ``[batch or 1, kv_len]`` (in cached decoding the query's is the
    cache index), and the segment ids of packed sequences (``None`` when not packed)."""

    q_positions: Array
    kv_positions: Array
    q_segments: Array | None = None
    kv_segments: Array | None = None


# ------------------------------------------------------ scaled dot-product attention
def grouped(q: Array, k: Array) -> Array:
    """``q`` ``[batch, len, heads, d]`` as ``[batch, len, kv_heads, heads / kv_heads, d]``: the
    query heads grouped by the key/value head they share (query head i uses K/V head
    i // (heads / kv_heads), as :func:`jax.nn.dot_product_attention`); one group per head in
    the paper."""
    return q.reshape(*q.shape[:2], k.shape[2], q.shape[2] // k.shape[2], q.shape[3])


def attention_weights(
    q: Array,
    k: Array,
    mask: Array | None = None,
    matmul_precision: str = "float32",
    kernels: str = "xla",
    score: Callable[[Array, Array, Callable[[Array, Array], Array]], Array] | None = None,
) -> Array:
    """softmax(Q K^T / sqrt(d_k)) as float32 ``[batch, heads, q_len, kv_len]`` (Eq. 1).

    Masked positions get weight 0; a query whose keys are all masked gets an
    all-zero row (never NaN). ``matmul_precision``: see
    :mod:`transformer_jax.kernels.precision`; ``kernels``: the kernel set; ``score``:
    ``score(q, k, dot)`` replaces the paper's ``dot(q, k)`` = Q K^T / sqrt(d_k).
    """

    def dot(q: Array, k: Array) -> Array:
        # bfloat16 inputs, float32 scores: the derivative's products stay on bfloat16 operands
        arithmetic = "bfloat16" if q.dtype == jnp.bfloat16 else matmul_precision
        einsum = functools.partial(_kernels.ops(kernels).einsum, preferred_element_type=jnp.float32)
        if q.shape[2] == k.shape[2]:  # the paper's: one key head per query head
            products = einsum("bqhd,bkhd->bhqk", q, k, arithmetic)
        else:  # [batch, kv_heads, group, q_len, kv_len], the groups' heads in order
            products = einsum("bqngd,bknd->bngqk", grouped(q, k), k, arithmetic)
        return products.reshape(q.shape[0], q.shape[2], *products.shape[-2:]) * q.shape[-1] ** -0.5

    scores = dot(q, k) if score is None else score(q, k, dot)
    if mask is None:
        return jax.nn.softmax(scores, axis=-1)
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    return jnp.where(mask, jax.nn.softmax(scores, axis=-1), 0.0)


def _check_inputs(q: Array, k: Array, v: Array, mask: Array | None, impl: str) -> None:
    """ValueError, in one line, for an unknown ``impl`` or inputs of the wrong shapes."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"impl must be one of {ATTENTION_IMPLS}, got {impl!r}")
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            "q, k, v must be [batch, length, heads, head_dim]; got shapes "
            f"{q.shape}, {k.shape}, {v.shape}"
        )
    if q.shape[-1] != k.shape[-1] or k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0]:
        raise ValueError(
            f"q/k head_dim, q/k/v batch and k/v [length, heads] must match; got {q.shape}, "
            f"{k.shape}, {v.shape}"
        )
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"q's {q.shape[2]} heads must be groups of k/v's {k.shape[2]} heads")
    check_mask(mask, q.shape[0], q.shape[1], k.shape[1], q.shape[2])


def scaled_dot_product_attention(
    q: Array,
    k: Array,
    v: Array,
    mask: Array | None = None,
    *,
    is_causal: bool = False,
    impl: str = "reference",
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    return_weights: bool = False,
    matmul_precision: str = "float32",
    kernels: str = "xla",
    score: Callable[[Array, Array, Callable[[Array, Array], Array]], Array] | None = None,
) -> Array | tuple[Array, Array]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (paper Eq. 1).

    Args:
      q: ``[batch, q_len, heads, d_k]``; k: ``[batch, kv_len, kv_heads, d_k]``;
        v: ``[batch, kv_len, kv_heads, d_v]``; kv_heads divides heads (grouped-query
        attention; :func:`grouped`), the paper's is heads.
      mask: boolean, ``True`` = may attend, broadcastable to
        ``[batch, heads, q_len, kv_len]``.
      is_causal: query i also sees only keys j <= i (§3.2.3), on top of ``mask``.
      impl: ``"reference"`` (explicit weights, the paper's equation), ``"fused"``
        (:func:`jax.nn.dot_product_attention`, XLA's implementation) or ``"cudnn"`` (the
        same with ``implementation="cudnn"``: cuDNN flash attention, for CUDA GPUs, with
        float16/bfloat16 inputs or ``matmul_precision='bfloat16'``). cuDNN takes a key
        mask ``[batch, 1, 1, kv_len]`` as key lengths, the form it handles natively: such
        a mask must be True on a prefix of the keys (right-padded sequences, as batching
        makes them); other masks become a dense bias.
      dropout_rate: dropout on the attention weights (reference only).
      return_weights: also return the float32 weights (reference only).
      matmul_precision: operand precision of the products
        (:mod:`transformer_jax.kernels.precision`).
      kernels: the kernel set of the reference path's products and dropout.
      score: ``score(q, k, dot)`` computes the scores in place of the paper's ``dot(q, k)``
        = Q K^T / sqrt(d_k) (reference only; :class:`MultiHeadAttention` makes it from a
        ``score_fn``).

    Returns:
      ``[batch, q_len, heads, d_v]`` in ``v.dtype`` (and the weights if asked).
      Rows whose keys are all masked are zero.
    """
    _check_inputs(q, k, v, mask, impl)
    use_dropout = dropout_rate > 0.0 and not deterministic
    if impl != "reference":
        if use_dropout or return_weights or score is not None:
            raise ValueError(
                f"impl={impl!r} supports neither attention dropout, returning weights nor a "
                "score hook; use impl='reference'"
            )
        if impl == "cudnn" and matmul_precision != "bfloat16" and q.dtype == jnp.float32:
            raise ValueError(
                "impl='cudnn' needs float16/bfloat16 inputs or matmul_precision='bfloat16'; "
                f"got dtype {q.dtype} (use impl='fused' for float32)"
            )
        return _fused_attention(q, k, v, mask, is_causal, impl, matmul_precision)

    if is_causal:
        mask = combine_masks(mask, causal_mask(q.shape[1]))
    weights = attention_weights(q, k, mask, matmul_precision, kernels, score)
    if use_dropout:
        if dropout_rng is None:
            raise ValueError("dropout_rng is required when dropout_rate > 0 and not deterministic")
        weights_dropped = _kernels.ops(kernels).dropout(weights, dropout_rate, dropout_rng)
    else:
        weights_dropped = weights
    einsum, weights_dropped = _kernels.ops(kernels).einsum, weights_dropped.astype(v.dtype)
    if q.shape[2] == k.shape[2]:
        out = einsum("bhqk,bkhd->bqhd", weights_dropped, v, matmul_precision)
    else:
        by_group = weights_dropped.reshape(q.shape[0], k.shape[2], -1, *weights.shape[2:])
        out = einsum("bngqk,bknd->bqngd", by_group, v, matmul_precision)
        out = out.reshape(*out.shape[:2], -1, out.shape[-1])
    return (out, weights) if return_weights else out


def _fused_attention(
    q: Array,
    k: Array,
    v: Array,
    mask: Array | None,
    is_causal: bool,
    impl: str,
    matmul_precision: str,
) -> Array:
    """:func:`jax.nn.dot_product_attention`, with fully-masked query rows set to zero.

    It needs d_k == d_v, so the narrower of (q, k) and v is zero-padded: exact, since
    zero columns change neither Q K^T nor the kept output columns. cuDNN gets a key mask
    as key lengths (no dense bias); a sequence with no key gets length 1 and zero values.
    """
    b, q_len, h, d_k = q.shape
    kv_len, d_v = k.shape[1], v.shape[-1]
    width = max(d_k, d_v)
    operand = jnp.bfloat16 if matmul_precision == "bfloat16" else None
    widen = lambda x: jnp.pad(  # noqa: E731
        x.astype(operand or x.dtype), ((0, 0),) * 3 + ((0, width - x.shape[-1]),)
    )
    lengths, any_key = None, None
    if mask is not None and impl == "cudnn" and mask.shape[1:3] == (1, 1):
        keys = jnp.broadcast_to(mask[:, 0, 0, :], (b, kv_len))
        lengths = jnp.sum(keys, axis=-1, dtype=jnp.int32)
        # a sequence without keys attends to its first key with zeroed values: its output
        # (and every gradient through it) is zero with no masked copy of the output
        v = jnp.where((lengths > 0)[:, None, None, None], v, 0)
        mask, lengths = None, jnp.maximum(lengths, 1)
    elif mask is not None:
        mask = jnp.broadcast_to(mask, (b, h, q_len, kv_len))
        seen = combine_masks(mask, causal_mask(q_len) if is_causal else None)
        any_key = jnp.transpose(jnp.any(seen, axis=-1), (0, 2, 1))[..., None]  # [b, q, h, 1]
    products = "highest" if matmul_precision == "float32" else "default"
    with jax.default_matmul_precision(products):  # the XLA implementation's einsums
        out = jax.nn.dot_product_attention(
            widen(q),
            widen(k),
            widen(v),
            mask=mask,
            scale=d_k**-0.5,
            is_causal=is_causal,
            key_value_seq_lengths=lengths,
            implementation="cudnn" if impl == "cudnn" else None,
        )[..., :d_v]
    if any_key is not None:
        out = jnp.where(any_key, out, 0)
    return out.astype(v.dtype)


def _hook(score_fn: ScoreFn, where: Where, q: Array, k: Array, dot: Callable) -> Array:
    return score_fn(q, k, where, dot)


def kv_cache(
    module: nn.Module, k: Array, v: Array, mask: Array | None, where: Where | None
) -> tuple[Array, Array, Array | None, Where | None]:
    """The KV cache of incremental decoding, in ``module``'s ``cache`` collection: any
    attention module calls it with its step's keys and values ``[batch, 1, kv_heads, d]``.

    The init call's length is the cache's capacity (returned unchanged); each later call
    writes its position at ``cache_index`` and returns the cache's keys, values, ``mask``
    with the unwritten slots masked out, and the :class:`Where` of this step (the query at
    the cache index)."""
    initialized = module.has_variable("cache", "cached_key")
    cached_key = module.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
    cached_value = module.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
    cache_index = module.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    if not initialized:
        return k, v, mask, where
    if k.shape[1] != 1:
        raise ValueError(f"decode=True takes one position per call, got length {k.shape[1]}")
    i, max_len = cache_index.value, cached_key.value.shape[1]
    cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, k, (0, i, 0, 0))
    cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, v, (0, i, 0, 0))
    cache_index.value = i + 1
    written = (jnp.arange(max_len) <= i)[None, None, None, :]
    step = Where(i[None, None], jnp.arange(max_len)[None])
    return cached_key.value, cached_value.value, combine_masks(mask, written), step


# ------------------------------------------------------------- multi-head attention
class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O (paper §3.2.2).

    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    ``qk_dim`` (d_k) and ``v_dim`` (d_v) are per head and may differ from
    each other and from ``d_model / num_heads`` (Table 3, rows A and B).

    ``causal=True`` is the decoder's masked self-attention (§3.2.3). With ``decode=True``
    it is the incremental decoder's self-attention over its :func:`kv_cache`, one position a
    call. ``kernels``: the kernel set (:mod:`transformer_jax.kernels`). ``score_fn``
    (:data:`ScoreFn`, reference attention only) replaces the paper's scores; it is given the
    absolute positions (default 0..length-1; in cached decoding the cache index) and segment
    ids of the call. A subclass may make other keys and values (:meth:`keys_values`, e.g.
    grouped-query attention in :mod:`transformer_jax.model.variants`).
    """

    num_heads: int
    qk_dim: int
    v_dim: int
    out_dim: int | None = None
    dropout_rate: float = 0.0
    impl: str = "reference"
    decode: bool = False
    sow_weights: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    matmul_precision: str = "float32"
    causal: bool = False
    kernels: str = "xla"
    kernel_init: Callable = nn.initializers.xavier_uniform()
    score_fn: ScoreFn | None = None
    use_bias: bool = False  # biases on the Q, K, V and output projections (not in the paper)

    @nn.compact
    def __call__(
        self,
        inputs_q: Array,
        inputs_kv: Array | None = None,
        mask: Array | None = None,
        deterministic: bool = True,
        where: Where | None = None,
    ) -> Array:
        """Self-attention when ``inputs_kv`` is None, else attention from q onto kv;
        ``where``: the positions and segments ``score_fn`` sees (default: 0..length-1)."""
        inputs_kv = inputs_q if inputs_kv is None else inputs_kv
        q = self.project("query", self.num_heads, self.qk_dim)(inputs_q)
        k, v = self.keys_values(inputs_kv)
        if self.decode:
            k, v, mask, where = kv_cache(self, k, v, mask, where)
        score = None
        if self.score_fn is not None:
            if where is None:
                where = Where(jnp.arange(q.shape[1])[None], jnp.arange(k.shape[1])[None])
            score = functools.partial(_hook, self.score_fn, where)
        dropout_rng = None
        if self.dropout_rate > 0.0 and not deterministic:
            dropout_rng = self.make_rng("dropout")
        result = scaled_dot_product_attention(
            q,
            k,
            v,
            mask,
            is_causal=self.causal and not self.decode,
            impl=self.impl,
            dropout_rate=self.dropout_rate,
            dropout_rng=dropout_rng,
            deterministic=deterministic,
            return_weights=self.sow_weights,
            matmul_precision=self.matmul_precision,
            kernels=self.kernels,
            score=score,
        )
        if self.sow_weights:
            result, weights = result
            self.sow("intermediates", "attention_weights", weights)
        out_dim = self.out_dim if self.out_dim is not None else inputs_q.shape[-1]
        return self.dense(out_dim, ("heads", "kv", "embed"), "out", axis=(-2, -1))(result)

    def keys_values(self, inputs_kv: Array) -> tuple[Array, Array]:
        """K and V ``[batch, kv_len, num_heads, d_k or d_v]``: one key and value head per
        query head (the paper's)."""
        key = self.project("key", self.num_heads, self.qk_dim)(inputs_kv)
        return key, self.project("value", self.num_heads, self.v_dim)(inputs_kv)

    def project(self, name: str, heads: int, dim: int, head_axis: str = "heads") -> nn.Module:
        """The projection ``name`` of the inputs to ``heads`` heads of ``dim``; ``head_axis``:
        the logical name of its heads (``partitioning``)."""
        return self.dense((heads, dim), ("embed", head_axis, "kv"), name)

    def dense(self, features: Any, axes: tuple[str, ...], name: str, **kw: Any) -> nn.Module:
        """A ``DenseGeneral`` at the module's dtypes, products and initialisation; ``axes``:
        the logical names of its kernel's axes (inputs then ``features``)."""
        bias_axes = axes[len(axes) - (len(features) if isinstance(features, tuple) else 1) :]
        return nn.DenseGeneral(
            features=features,
            use_bias=self.use_bias,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=logical(self.kernel_init, axes),
            bias_init=logical(nn.initializers.zeros_init(), bias_axes),
            dot_general=_kernels.ops(self.kernels).dot_general(self.matmul_precision),
            name=name,
            **kw,
        )
