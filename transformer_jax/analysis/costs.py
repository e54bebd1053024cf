"""What attention costs: probability-matrix memory and matmul FLOPs (paper §4, Table 1).

Self-attention over N tokens builds an ``N x N`` probability matrix per head and layer,
so its memory and its share of the FLOPs grow as N^2 while everything else grows as N.

Units: ``format_bytes`` states both decimal (MB = 10^6 B, GB = 10^9 B) and binary
(MiB = 2^20 B, GiB = 2^30 B) units, because the two differ by 5-7% at these sizes:
BERT-base's fp16 probabilities for one 512-token sequence are 75.5 MB = 72 MiB.

FLOP convention: a multiply-add is 2 FLOPs; only matrix products are counted (softmax,
LayerNorm, residuals and the embedding lookup are a few FLOPs per element, not per
weight). Training costs 3x the forward pass: the backward pass computes the gradient
with respect to both the activations and the weights, 2x the forward's matmuls
(Kaplan et al. 2020, "Scaling Laws for Neural Language Models", §2.1; Chowdhery et al.
2022, PaLM, Appendix B: 6N + 12 L H Q T training FLOPs per token, 6N for the N dense
weights and 12 L H Q T for the attention scores and weighted sums over context T).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from transformer_jax.model.attention import scaled_dot_product_attention
from transformer_jax.model.config import TransformerConfig
from transformer_jax.options import ATTENTION_IMPLS

TRAINING_TO_FORWARD = 3  # forward + backward (activation and weight gradients) = 3x forward


# ------------------------------------------------------------------------ memory
def attention_matrix_bytes(
    num_layers: int,
    num_heads: int,
    q_len: int,
    kv_len: int | None = None,
    *,
    batch: int = 1,
    bytes_per_element: int = 2,
) -> int:
    """Bytes of the attention probabilities softmax(Q K^T / sqrt(d_k)) kept for backward.

    ``num_layers * num_heads * batch * q_len * kv_len * bytes_per_element``
    (``kv_len`` defaults to ``q_len``: self-attention). With the blog's BERT-base numbers
    (12 layers, 12 heads, fp16 = 2 bytes) that is 75.5 MB at N = 512 and 19.3 GB at
    N = 8192 for one sequence.
    """
    kv_len = q_len if kv_len is None else kv_len
    for name, value in (
        ("num_layers", num_layers),
        ("num_heads", num_heads),
        ("q_len", q_len),
        ("kv_len", kv_len),
        ("batch", batch),
        ("bytes_per_element", bytes_per_element),
    ):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return num_layers * num_heads * batch * q_len * kv_len * bytes_per_element


def model_attention_bytes(
    config: TransformerConfig,
    src_len: int,
    tgt_len: int,
    *,
    batch: int = 1,
    bytes_per_element: int = 4,
) -> dict[str, int]:
    """Attention-probability bytes of one forward pass of ``config``, by attention kind.

    Keys ``'encoder'`` (S x S per head and layer), ``'decoder_self'`` (T x T) and
    ``'cross'`` (T x S). The default 4 bytes is what the reference attention stores: its
    softmax is computed in float32 whatever ``config.dtype`` (DESIGN.md, Conventions).
    """
    h = config.num_heads
    common = {"batch": batch, "bytes_per_element": bytes_per_element}
    return {
        "encoder": attention_matrix_bytes(config.num_encoder_layers, h, src_len, **common),
        "decoder_self": attention_matrix_bytes(config.num_decoder_layers, h, tgt_len, **common),
        "cross": attention_matrix_bytes(config.num_decoder_layers, h, tgt_len, src_len, **common),
    }


def format_bytes(num_bytes: float) -> str:
    """``'75.5 MB (72.0 MiB)'``: decimal units, then binary units in parentheses."""
    decimal = _scaled(num_bytes, 1000, ("B", "kB", "MB", "GB", "TB", "PB"))
    binary = _scaled(num_bytes, 1024, ("B", "KiB", "MiB", "GiB", "TiB", "PiB"))
    return f"{decimal} ({binary})"


def _scaled(value: float, base: int, units: tuple[str, ...]) -> str:
    unit = 0
    while abs(value) >= base and unit < len(units) - 1:
        value /= base
        unit += 1
    return f"{value:.0f} {units[0]}" if unit == 0 else f"{value:.1f} {units[unit]}"


def xla_attention_memory(
    seq_len: int,
    *,
    num_heads: int = 8,
    head_dim: int = 64,
    batch: int = 1,
    impl: str = "reference",
    dtype: Any = jnp.float32,
) -> dict[str, int]:
    """XLA's own memory analysis of one compiled scaled dot-product attention call.

    Compiles :func:`~transformer_jax.model.attention.scaled_dot_product_attention` for
    q = k = v of shape ``[batch, seq_len, num_heads, head_dim]`` on the default backend and
    returns three fields of ``Compiled.memory_analysis()``:
    ``temp_size_in_bytes`` (scratch buffers: for the reference attention the float32
    N x N scores and probabilities), ``argument_size_in_bytes`` (q, k, v) and
    ``output_size_in_bytes``. Nothing is executed.

    ``impl='fused'`` calls :func:`jax.nn.dot_product_attention` without an
    ``implementation``, which is its XLA path on every backend: the same
    N x N buffers. Only ``implementation='cudnn'`` (GPU, fp16/bf16) is flash attention,
    whose scratch memory grows as N rather than N^2.
    """
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"impl must be one of {ATTENTION_IMPLS}, got {impl!r}")
    if not isinstance(seq_len, int) or seq_len <= 0:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
    qkv = jax.ShapeDtypeStruct((batch, seq_len, num_heads, head_dim), dtype)

    attend = lambda q, k, v: scaled_dot_product_attention(q, k, v, impl=impl)  # noqa: E731
    stats = jax.jit(attend).lower(qkv, qkv, qkv).compile().memory_analysis()
    fields = ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes")
    return {name: int(getattr(stats, name)) for name in fields}


# ------------------------------------------------------------------------- FLOPs
def _attention_flops(
    config: TransformerConfig, q_len: int, kv_len: int, project_kv: bool = True
) -> dict[str, int]:
    """Forward matmul FLOPs of one multi-head attention sub-layer (§3.2.2)."""
    d, h, d_k, d_v = config.d_model, config.num_heads, config.head_qk_dim, config.head_v_dim
    projections = 2 * q_len * d * h * d_k  # Q = X W^Q
    projections += 2 * kv_len * d * h * (d_k + d_v) if project_kv else 0  # K, V
    projections += 2 * q_len * h * d_v * d  # Concat(heads) W^O
    scores = 2 * h * q_len * kv_len * d_k  # Q K^T
    weighted_sum = 2 * h * q_len * kv_len * d_v  # softmax(.) V
    return {"projections": projections, "attention": scores + weighted_sum}


def forward_flops(config: TransformerConfig, src_len: int, tgt_len: int) -> dict[str, int]:
    """Matmul FLOPs of one forward pass over one (source, target) pair, by component.

    Keys: ``'attention_projections'`` (W^Q, W^K, W^V, W^O of all attention sub-layers),
    ``'attention_scores'`` (Q K^T and the weighted sum of V: the N-dependent terms,
    S^2 + T^2 + T S per head and layer), ``'ffn'`` (Eq. 2: 2 d_model d_ff per token and
    layer, times 2) and ``'output'`` (the pre-softmax projection to the vocabulary, §3.4).
    Decoder self-attention is counted over the full T x T product, as the reference and
    XLA attention compute it (the causal mask zeroes half of it after the fact).
    """
    for name, value in (("src_len", src_len), ("tgt_len", tgt_len)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    d, d_ff = config.d_model, config.d_ff
    enc_self = _attention_flops(config, src_len, src_len)
    dec_self = _attention_flops(config, tgt_len, tgt_len)
    cross = _attention_flops(config, tgt_len, src_len)
    n_enc, n_dec = config.num_encoder_layers, config.num_decoder_layers
    ffn = lambda length: 2 * 2 * length * d * d_ff  # noqa: E731
    return {
        "attention_projections": n_enc * enc_self["projections"]
        + n_dec * (dec_self["projections"] + cross["projections"]),
        "attention_scores": n_enc * enc_self["attention"]
        + n_dec * (dec_self["attention"] + cross["attention"]),
        "ffn": n_enc * ffn(src_len) + n_dec * ffn(tgt_len),
        "output": 2 * tgt_len * d * config.tgt_vocab,
    }


def training_flops(config: TransformerConfig, src_len: int, tgt_len: int, batch: int = 1) -> int:
    """Matmul FLOPs of one training step (forward + backward = 3x forward) on ``batch`` pairs."""
    return TRAINING_TO_FORWARD * batch * sum(forward_flops(config, src_len, tgt_len).values())


def training_flops_per_token(config: TransformerConfig, src_len: int, tgt_len: int) -> float:
    """Training FLOPs per source-plus-target token (the unit of ``data.tokens_per_batch``).

    Model FLOPs utilisation = tokens/s x this / the hardware's peak FLOP/s. Per token it is
    6 x (the dense weights the token meets) plus the N-dependent attention term, the
    encoder-decoder form of PaLM's 6N + 12 L H Q T.
    """
    return training_flops(config, src_len, tgt_len) / (src_len + tgt_len)
