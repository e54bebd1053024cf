"""costs.py: the blog's attention-memory numbers, FLOP counts, XLA's measured N^2 growth."""

import math

import jax
import jax.extend
import jax.numpy as jnp
import pytest
from conftest import TINY_CONFIG

from transformer_jax import Transformer
from transformer_jax.analysis.costs import (
    attention_matrix_bytes,
    format_bytes,
    forward_flops,
    model_attention_bytes,
    training_flops,
    training_flops_per_token,
    xla_attention_memory,
)

TINY = TINY_CONFIG.replace(
    vocab_size=10, d_model=8, d_ff=16, num_encoder_layers=1, num_decoder_layers=1, max_len=16
)


def test_blog_bert_base_fp16_attention_memory():
    # 12 layers x 12 heads x N^2 x 2 bytes (fp16), one sequence.
    at_512 = attention_matrix_bytes(12, 12, 512)
    at_8192 = attention_matrix_bytes(12, 12, 8192)
    assert at_512 == 75_497_472 == 72 * 2**20
    assert at_8192 == 19_327_352_832 == 18 * 2**30
    assert format_bytes(at_512) == "75.5 MB (72.0 MiB)"
    assert format_bytes(at_8192) == "19.3 GB (18.0 GiB)"
    assert at_8192 / at_512 == (8192 / 512) ** 2


def test_attention_matrix_bytes_rejects_negative_sizes():
    with pytest.raises(ValueError, match="q_len"):
        attention_matrix_bytes(12, 12, -1)


def test_model_attention_bytes_by_kind():
    got = model_attention_bytes(TINY, src_len=3, tgt_len=2, batch=5)
    assert got == {"encoder": 1 * 2 * 5 * 3 * 3 * 4, "decoder_self": 2 * 5 * 2 * 2 * 4,
                   "cross": 2 * 5 * 2 * 3 * 4}  # fmt: skip


def test_forward_flops_hand_count_tiny():
    # d=8, h=2, d_k=d_v=4, d_ff=16, V=10, one encoder and one decoder layer, S=3, T=2.
    enc_proj = 2 * 3 * 8 * 8 * 4  # Q, K, V, O over 3 source tokens
    dec_proj = 2 * 2 * 8 * 8 * 4  # Q, K, V, O over 2 target tokens
    cross_proj = 2 * 2 * 8 * 8 * 2 + 2 * 3 * 8 * 8 * 2  # Q, O on target; K, V on source
    scores = 2 * 2 * (3 * 3 + 2 * 2 + 2 * 3) * 4 * 2  # QK^T and weights.V: S^2 + T^2 + TS
    got = forward_flops(TINY, src_len=3, tgt_len=2)
    assert got == {
        "attention_projections": enc_proj + dec_proj + cross_proj,  # 3840
        "attention_scores": scores,  # 608
        "ffn": 2 * 2 * (3 + 2) * 8 * 16,  # 2560
        "output": 2 * 2 * 8 * 10,  # 320
    }
    assert training_flops(TINY, 3, 2, batch=4) == 3 * 4 * 7328
    assert training_flops_per_token(TINY, 3, 2) == 3 * 7328 / 5


def _jaxpr_dot_flops(jaxpr) -> int:
    """2 x multiply-adds of every dot_general in a (closed) jaxpr, recursively."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            out = eqn.outvars[0].aval.shape
            total += 2 * math.prod(out) * math.prod(lhs[i] for i in lhs_contract)
    return total + sum(_jaxpr_dot_flops(sub) for sub in jax.extend.core.subjaxprs(jaxpr))


def test_forward_flops_match_the_models_matmuls():
    cfg = TINY.replace(qk_dim=3, v_dim=5, num_encoder_layers=2, num_decoder_layers=3, vocab_size=11)
    src, tgt = jnp.ones((1, 7), jnp.int32), jnp.ones((1, 4), jnp.int32)
    model = Transformer(cfg)
    params = jax.eval_shape(model.init, jax.random.key(0), src, tgt)  # shapes only
    jaxpr = jax.make_jaxpr(lambda p: model.apply(p, src, tgt))(params).jaxpr
    assert _jaxpr_dot_flops(jaxpr) == sum(forward_flops(cfg, 7, 4).values())


def test_xla_reference_attention_temp_memory_grows_quadratically():
    small = xla_attention_memory(128, num_heads=4, head_dim=16)
    large = xla_attention_memory(256, num_heads=4, head_dim=16)
    ratio = large["temp_size_in_bytes"] / small["temp_size_in_bytes"]
    assert 3.5 < ratio < 4.5
    # The arguments (q, k, v) grow linearly.
    assert large["argument_size_in_bytes"] == 2 * small["argument_size_in_bytes"]
    # The scratch space holds at least the float32 N x N probabilities.
    assert large["temp_size_in_bytes"] >= attention_matrix_bytes(1, 4, 256, bytes_per_element=4)


def test_xla_attention_memory_rejects_unknown_impl():
    with pytest.raises(ValueError, match="impl"):
        xla_attention_memory(8, impl="flash")
