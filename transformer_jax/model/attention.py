"""Scaled dot-product attention, masks and multi-head attention (paper §3.2).

Layout conventions: inside attention arrays are ``[batch, length, heads, head_dim]``
(the layout of :func:`jax.nn.dot_product_attention`); masks are boolean with
``True`` = may attend, broadcastable to ``[batch, heads, q_len, kv_len]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.kernels import matmul
from transformer_jax.kernels.dropout import dropout

Array = jax.Array

ATTENTION_IMPLS = ("reference", "fused", "cudnn")


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
) -> Array:
    """softmax(Q K^T / sqrt(d_k)) as float32 ``[batch, heads, q_len, kv_len]`` (Eq. 1).

    Masked positions get weight 0; a query whose keys are all masked gets an
    all-zero row (never NaN). ``matmul_precision``: see :mod:`transformer_jax.kernels.matmul`.
    """
    scale = q.shape[-1] ** -0.5
    scores = matmul.einsum(
        "bqhd,bkhd->bhqk", q, k, matmul_precision, preferred_element_type=jnp.float32
    )
    scores = scores * scale
    if mask is None:
        return jax.nn.softmax(scores, axis=-1)
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    return jnp.where(mask, jax.nn.softmax(scores, axis=-1), 0.0)


def scaled_dot_product_attention(
    q: Array,
    k: Array,
    v: Array,
    mask: Array | None = None,
    *,
    impl: str = "reference",
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    return_weights: bool = False,
    matmul_precision: str = "float32",
) -> Array | tuple[Array, Array]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (paper Eq. 1).

    Args:
      q: ``[batch, q_len, heads, d_k]``; k: ``[batch, kv_len, heads, d_k]``;
        v: ``[batch, kv_len, heads, d_v]``.
      mask: boolean, ``True`` = may attend, broadcastable to
        ``[batch, heads, q_len, kv_len]``.
      impl: ``"reference"`` (explicit weights, the paper's equation), ``"fused"``
        (:func:`jax.nn.dot_product_attention`, XLA's implementation) or ``"cudnn"`` (the
        same with ``implementation="cudnn"``: cuDNN flash attention; GPU and
        float16/bfloat16 inputs only).
      dropout_rate: dropout on the attention weights (reference only).
      return_weights: also return the float32 weights (reference only).
      matmul_precision: operand precision of the reference path's two products
        (:mod:`transformer_jax.kernels.matmul`); the fused paths compute in the inputs' dtype.

    Returns:
      ``[batch, q_len, heads, d_v]`` in ``v.dtype`` (and the weights if asked).
      Rows whose keys are all masked are zero.
    """
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
    use_dropout = dropout_rate > 0.0 and not deterministic
    if impl != "reference":
        if use_dropout or return_weights:
            raise ValueError(
                f"impl={impl!r} supports neither attention dropout nor returning "
                "weights; use impl='reference'"
            )
        if impl == "cudnn" and (
            jax.default_backend() != "gpu" or q.dtype not in (jnp.float16, jnp.bfloat16)
        ):
            raise ValueError(
                "impl='cudnn' needs a GPU backend and float16/bfloat16 inputs; got backend "
                f"{jax.default_backend()!r} and dtype {q.dtype} (use impl='fused' elsewhere)"
            )
        return _fused_attention(q, k, v, mask, "cudnn" if impl == "cudnn" else None)

    weights = attention_weights(q, k, mask, matmul_precision)
    if use_dropout:
        if dropout_rng is None:
            raise ValueError("dropout_rng is required when dropout_rate > 0 and not deterministic")
        weights_dropped = dropout(weights, dropout_rate, dropout_rng)
    else:
        weights_dropped = weights
    out = matmul.einsum("bhqk,bkhd->bqhd", weights_dropped.astype(v.dtype), v, matmul_precision)
    return (out, weights) if return_weights else out


def _fused_attention(
    q: Array, k: Array, v: Array, mask: Array | None, implementation: str | None
) -> Array:
    """:func:`jax.nn.dot_product_attention`, with fully-masked query rows set to zero.

    It needs d_k == d_v, so the narrower of (q, k) and v is zero-padded: exact, since
    zero columns change neither Q K^T nor the kept output columns.
    """
    d_k, d_v = q.shape[-1], v.shape[-1]
    width = max(d_k, d_v)
    widen = lambda x: jnp.pad(x, ((0, 0),) * 3 + ((0, width - x.shape[-1]),))  # noqa: E731
    if mask is not None:
        b, q_len, h, _ = q.shape
        mask = jnp.broadcast_to(mask, (b, h, q_len, k.shape[1]))
    out = jax.nn.dot_product_attention(
        widen(q), widen(k), widen(v), mask=mask, scale=d_k**-0.5, implementation=implementation
    )[..., :d_v]
    if mask is None:
        return out
    any_key = jnp.transpose(jnp.any(mask, axis=-1), (0, 2, 1))[..., None]  # [b, q, h, 1]
    return jnp.where(any_key, out, 0).astype(v.dtype)


# ------------------------------------------------------------- multi-head attention
def position_wise(layer: Callable[[Array], Array], x: Array, feature_axes: int = 1) -> Array:
    """``layer(x)`` computed on ``x`` flattened to ``[positions, *features]`` (§3.3).

    Position-wise layers treat every position alike, so this equals ``layer(x)``; XLA's
    CPU backend runs the flattened form as plain matrix products, where on
    ``[batch, length, ...]`` inputs it emitted batched products and layout copies (the
    training step is ~1.1x faster; ``benchmarks/train_throughput.py``).
    """
    lead = x.shape[: x.ndim - feature_axes]
    y = layer(x.reshape((-1,) + x.shape[x.ndim - feature_axes :]))
    return y.reshape(lead + y.shape[1:])


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O (paper §3.2.2).

    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    ``qk_dim`` (d_k) and ``v_dim`` (d_v) are per head and may differ from
    each other and from ``d_model / num_heads`` (Table 3, rows A and B).

    With ``decode=True`` it is the incremental decoder's self-attention: each call takes
    one new position, appends its key and value to a ``cache`` collection sized at
    initialisation, and attends over the positions written so far.
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
    kernel_init: Callable = nn.initializers.xavier_uniform()

    @nn.compact
    def __call__(
        self,
        inputs_q: Array,
        inputs_kv: Array | None = None,
        mask: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        """Self-attention when ``inputs_kv`` is None, else attention from q onto kv."""
        inputs_kv = inputs_q if inputs_kv is None else inputs_kv
        proj = lambda name, dim: nn.DenseGeneral(  # noqa: E731
            features=(self.num_heads, dim),
            use_bias=False,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=self.kernel_init,
            dot_general=matmul.dot_general(self.matmul_precision),
            name=name,
        )
        q = position_wise(proj("query", self.qk_dim), inputs_q)
        k = position_wise(proj("key", self.qk_dim), inputs_kv)
        v = position_wise(proj("value", self.v_dim), inputs_kv)

        if self.decode:
            k, v, mask = self._update_cache(k, v, mask)

        dropout_rng = None
        if self.dropout_rate > 0.0 and not deterministic:
            dropout_rng = self.make_rng("dropout")
        result = scaled_dot_product_attention(
            q,
            k,
            v,
            mask,
            impl=self.impl,
            dropout_rate=self.dropout_rate,
            dropout_rng=dropout_rng,
            deterministic=deterministic,
            return_weights=self.sow_weights,
            matmul_precision=self.matmul_precision,
        )
        if self.sow_weights:
            result, weights = result
            self.sow("intermediates", "attention_weights", weights)
        out_dim = self.out_dim if self.out_dim is not None else inputs_q.shape[-1]
        out = nn.DenseGeneral(
            features=out_dim,
            axis=(-2, -1),
            use_bias=False,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=self.kernel_init,
            dot_general=matmul.dot_general(self.matmul_precision),
            name="out",
        )
        return position_wise(out, result, feature_axes=2)

    def _update_cache(self, k: Array, v: Array, mask: Array | None) -> tuple[Array, Array, Array]:
        """Write this step's key/value at ``cache_index`` and mask out unwritten slots."""
        initialized = self.has_variable("cache", "cached_key")
        cached_key = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
        cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
        if not initialized:  # init call: the given length is the cache's capacity
            return k, v, mask
        batch, steps, heads, _ = k.shape
        max_len = cached_key.value.shape[1]
        if steps != 1:
            raise ValueError(f"decode=True takes one position per call, got length {steps}")
        i = cache_index.value
        cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, k, (0, i, 0, 0))
        cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, v, (0, i, 0, 0))
        cache_index.value = i + 1
        written = (jnp.arange(max_len) <= i)[None, None, None, :]
        return cached_key.value, cached_value.value, combine_masks(mask, written)
