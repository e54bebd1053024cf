"""Scaled dot-product attention, masks and multi-head attention (paper §3.2).

Layout conventions: inside attention arrays are ``[batch, length, heads, head_dim]``
(the layout of :func:`jax.nn.dot_product_attention`); masks are boolean with
``True`` = may attend, broadcastable to ``[batch, heads, q_len, kv_len]``.
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
from transformer_jax.model.partitioning import logical
from transformer_jax.options import ATTENTION_IMPLS

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


# --------------------------------------------------------------------------- masks
def padding_mask(tokens: Array, pad_id: int = 0) -> Array:
    """Key mask ``[batch, 1, 1, kv_len]``: ``True`` where ``tokens != pad_id``."""
    return (tokens != pad_id)[:, None, None, :]


def causal_mask(length: int) -> Array:
    """``[1, 1, length, length]`` lower-triangular mask: query i sees keys j <= i (§3.2.3)."""
    return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def segment_mask(q_segments: Array, kv_segments: Array) -> Array:
    """``[batch, 1, q_len, kv_len]``: packed sequences attend only within their segment.

    Segment id 0 marks padding and never attends nor is attended to.
    """
    same = q_segments[:, None, :, None] == kv_segments[:, None, None, :]
    return same & (kv_segments != 0)[:, None, None, :]


def check_mask(mask: Any, batch: int, q_len: int, kv_len: int, heads: int) -> None:
    """A mask must be boolean of rank 4, broadcastable to ``[batch, heads, q_len, kv_len]``
    (``True`` = may attend); a float 0/1 or additive mask is refused."""
    if mask is None:
        return
    shape = getattr(mask, "shape", None)
    if getattr(mask, "dtype", None) != jnp.bool_ or len(shape) != 4:
        raise ValueError(
            "mask must be boolean [batch, heads, q_len, kv_len] (True = may attend; "
            f"float or additive masks are not accepted), got {getattr(mask, 'dtype', None)} "
            f"of shape {shape}"
        )
    for size, want, name in zip(
        shape, (batch, heads, q_len, kv_len), ("batch", "heads", "q_len", "kv_len"), strict=True
    ):
        if size not in (1, want):
            raise ValueError(
                f"mask {shape} does not broadcast to [batch, heads, q_len, kv_len] = "
                f"{(batch, heads, q_len, kv_len)}: its {name} is {size}"
            )


def combine_masks(*masks: Array | None) -> Array | None:
    """Logical AND of the given masks (``None`` entries are ignored)."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    out = present[0]
    for m in present[1:]:
        out = jnp.logical_and(out, m)
    return out


# ------------------------------------------------------ scaled dot-product attention
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
        products = _kernels.ops(kernels).einsum(
            "bqhd,bkhd->bhqk", q, k, arithmetic, preferred_element_type=jnp.float32
        )
        return products * q.shape[-1] ** -0.5

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
    if q.shape[-1] != k.shape[-1] or k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"q/k head_dim and k/v [batch, length, heads] must match; got {q.shape}, "
            f"{k.shape}, {v.shape}"
        )
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
      q: ``[batch, q_len, heads, d_k]``; k: ``[batch, kv_len, heads, d_k]``;
        v: ``[batch, kv_len, heads, d_v]``.
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
    out = _kernels.ops(kernels).einsum(
        "bhqk,bkhd->bqhd", weights_dropped.astype(v.dtype), v, matmul_precision
    )
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
    as key lengths (no dense bias).
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
        mask, any_key = None, (lengths > 0)[:, None, None, None]
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


# ------------------------------------------------------------- multi-head attention
class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O (paper §3.2.2).

    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    ``qk_dim`` (d_k) and ``v_dim`` (d_v) are per head and may differ from
    each other and from ``d_model / num_heads`` (Table 3, rows A and B).

    ``causal=True`` is the decoder's masked self-attention (§3.2.3). With ``decode=True``
    it is the incremental decoder's self-attention: each call takes one new position,
    appends its key and value to a ``cache`` collection sized at initialisation, and
    attends over the positions written so far. ``kernels``: the kernel set
    (:mod:`transformer_jax.kernels`). ``score_fn`` (:data:`ScoreFn`, reference attention
    only) replaces the paper's scores; it is given the absolute positions (default
    0..length-1; in cached decoding the cache index) and segment ids of the call.
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
        ops = _kernels.ops(self.kernels)
        proj = lambda name, dim: nn.DenseGeneral(  # noqa: E731
            features=(self.num_heads, dim),
            use_bias=self.use_bias,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=logical(self.kernel_init, ("embed", "heads", "kv")),
            bias_init=logical(nn.initializers.zeros_init(), ("heads", "kv")),
            dot_general=ops.dot_general(self.matmul_precision),
            name=name,
        )
        q = proj("query", self.qk_dim)(inputs_q)
        k = proj("key", self.qk_dim)(inputs_kv)
        v = proj("value", self.v_dim)(inputs_kv)

        if self.decode:
            k, v, mask, index = self._update_cache(k, v, mask)
            if index is not None:  # this step's query sits at the cache index
                where = Where(index[None, None], jnp.arange(k.shape[1])[None])
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
        out = nn.DenseGeneral(
            features=out_dim,
            axis=(-2, -1),
            use_bias=self.use_bias,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=logical(self.kernel_init, ("heads", "kv", "embed")),
            bias_init=logical(nn.initializers.zeros_init(), ("embed",)),
            dot_general=ops.dot_general(self.matmul_precision),
            name="out",
        )
        return out(result)

    def _update_cache(
        self, k: Array, v: Array, mask: Array | None
    ) -> tuple[Array, Array, Array | None, Array | None]:
        """Write this step's key/value at ``cache_index`` and mask out unwritten slots; also
        return that index (``None`` on the init call)."""
        initialized = self.has_variable("cache", "cached_key")
        cached_key = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
        cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
        if not initialized:  # init call: the given length is the cache's capacity
            return k, v, mask, None
        batch, steps, heads, _ = k.shape
        max_len = cached_key.value.shape[1]
        if steps != 1:
            raise ValueError(f"decode=True takes one position per call, got length {steps}")
        i = cache_index.value
        cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, k, (0, i, 0, 0))
        cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, v, (0, i, 0, 0))
        cache_index.value = i + 1
        written = (jnp.arange(max_len) <= i)[None, None, None, :]
        return cached_key.value, cached_value.value, combine_masks(mask, written), i
