"""Scaled dot-product attention and multi-head attention: properties from the paper (§3.2)."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.model.attention import (
    MultiHeadAttention,
    attention_weights,
    causal_mask,
    combine_masks,
    padding_mask,
    scaled_dot_product_attention,
    segment_mask,
)


def qkv(batch=2, q_len=5, kv_len=6, heads=3, d_k=8, d_v=8, seed=0, dtype=jnp.float32):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (
        jax.random.normal(kq, (batch, q_len, heads, d_k), dtype),
        jax.random.normal(kk, (batch, kv_len, heads, d_k), dtype),
        jax.random.normal(kv, (batch, kv_len, heads, d_v), dtype),
    )


def test_matches_equation_one_by_hand():
    """softmax(QK^T / sqrt(d_k)) V on a 2-token, d_k = 4 example computed with numpy."""
    q = np.array([[1.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0]], np.float32)
    k = np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]], np.float32)
    v = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    # scores / sqrt(4): row 0 = [1, 1] / 2, row 1 = [2, 0] / 2
    w0 = np.array([0.5, 0.5])
    w1 = np.exp([1.0, 0.0]) / np.exp([1.0, 0.0]).sum()
    expected = np.stack([w0 @ v, w1 @ v])
    out = scaled_dot_product_attention(q[None, :, None], k[None, :, None], v[None, :, None])
    np.testing.assert_allclose(out[0, :, 0], expected, rtol=1e-6)
    np.testing.assert_allclose(expected[1], [1 + 2 * w1[1], 2 + 2 * w1[1]], rtol=1e-6)


class TestShapes(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_output_shape_dtype(self):
        for impl in ("reference", "fused"):
            for dtype in (jnp.float32, jnp.bfloat16):
                q, k, v = qkv(d_k=8, d_v=6, dtype=dtype)
                fn = self.variant(
                    lambda q, k, v, impl=impl: scaled_dot_product_attention(q, k, v, impl=impl)
                )
                out = fn(q, k, v)
                chex.assert_shape(out, (2, 5, 3, 6))
                chex.assert_type(out, dtype)

    @chex.variants(with_jit=True, without_jit=True)
    def test_multi_head_shapes(self):
        x = jnp.ones((2, 7, 16))
        mha = MultiHeadAttention(num_heads=4, qk_dim=5, v_dim=3)
        params = nn.unbox(mha.init(jax.random.key(0), x))
        out = self.variant(mha.apply)(params, x)
        chex.assert_shape(out, (2, 7, 16))
        p = params["params"]
        chex.assert_shape(p["query"]["kernel"], (16, 4, 5))
        chex.assert_shape(p["key"]["kernel"], (16, 4, 5))
        chex.assert_shape(p["value"]["kernel"], (16, 4, 3))
        chex.assert_shape(p["out"]["kernel"], (4, 3, 16))


def test_weights_rows_sum_to_one_and_nonnegative():
    q, k, _ = qkv()
    mask = padding_mask(jnp.array([[5, 6, 7, 0, 0, 0], [1, 2, 3, 4, 5, 6]]))
    w = attention_weights(q, k, mask)
    assert (w >= 0).all()
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)
    assert (w[0, :, :, 3:] == 0).all()


def test_fully_masked_rows_are_zero_not_nan():
    q, k, v = qkv()
    mask = jnp.zeros((2, 1, 5, 6), bool).at[:, :, :2].set(True)  # queries 2..4 see nothing
    for impl in ("reference", "fused"):
        out = scaled_dot_product_attention(q, k, v, mask, impl=impl)
        assert jnp.isfinite(out).all()
        np.testing.assert_array_equal(out[:, 2:], 0.0)
        assert jnp.abs(out[:, :2]).sum() > 0
    assert (attention_weights(q, k, mask)[:, :, 2:] == 0).all()


def test_softmax_in_float32_for_bfloat16_inputs():
    q, k, _ = qkv(dtype=jnp.bfloat16)
    w = attention_weights(q, k)
    assert w.dtype == jnp.float32
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)


def test_scaling_brings_score_variance_to_one():
    """§3.2.1 footnote 4: q.k of unit-variance components has variance d_k; the library's
    1/sqrt(d_k) brings it to 1. Read back from its weights: within a row, log(weights) is
    the scaled scores minus one constant, so their variance over the keys is the scores'."""
    d_k = 64
    q, k, _ = qkv(batch=1, q_len=64, kv_len=512, heads=4, d_k=d_k, seed=1)
    log_weights = jnp.log(attention_weights(q, k))  # [1, 4, 64, 512]
    variance = float(log_weights.var(axis=-1).mean())
    assert abs(variance - 1.0) < 0.1, variance  # unscaled: ~d_k; scaled by 1/d_k: ~1/d_k


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal", "segments"])
@pytest.mark.parametrize("dims", [(8, 8), (8, 4), (4, 8)])
def test_fused_matches_reference(mask_kind, dims):
    d_k, d_v = dims
    q, k, v = qkv(q_len=6, kv_len=6, d_k=d_k, d_v=d_v, seed=3)
    tokens = jnp.array([[4, 5, 6, 7, 0, 0], [1, 2, 3, 4, 5, 6]])
    segs = jnp.array([[1, 1, 2, 2, 2, 0], [1, 2, 3, 3, 3, 3]])
    mask = {
        "none": None,
        "padding": padding_mask(tokens),
        "causal": combine_masks(causal_mask(6), padding_mask(tokens)),
        "segments": segment_mask(segs, segs),
    }[mask_kind]
    ref = scaled_dot_product_attention(q, k, v, mask, impl="reference")
    fused = scaled_dot_product_attention(q, k, v, mask, impl="fused")
    np.testing.assert_allclose(fused, ref, atol=1e-5, rtol=1e-5)


def test_causal_mask_is_lower_triangular():
    m = causal_mask(4)[0, 0]
    np.testing.assert_array_equal(m, np.tril(np.ones((4, 4), bool)))


def test_segment_mask_isolates_segments_and_padding():
    segs = jnp.array([[1, 1, 2, 0]])
    m = segment_mask(segs, segs)[0, 0]
    expected = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], bool)
    np.testing.assert_array_equal(m, expected)  # a pad query (segment 0) attends nowhere


def test_attention_dropout_only_when_training():
    q, k, v = qkv()
    a = scaled_dot_product_attention(q, k, v, dropout_rate=0.5, deterministic=True)
    b = scaled_dot_product_attention(q, k, v)
    np.testing.assert_array_equal(a, b)
    c = scaled_dot_product_attention(
        q, k, v, dropout_rate=0.5, dropout_rng=jax.random.key(0), deterministic=False
    )
    assert not np.allclose(c, b)


def test_bad_inputs_raise_value_error():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="impl"):
        scaled_dot_product_attention(q, k, v, impl="flash")
    with pytest.raises(ValueError, match=r"\[batch, length, heads, head_dim\]"):
        scaled_dot_product_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="fused"):
        scaled_dot_product_attention(q, k, v, impl="fused", return_weights=True)
    with pytest.raises(ValueError, match="impl='cudnn' needs float16/bfloat16 inputs"):
        scaled_dot_product_attention(q, k, v, impl="cudnn")


def test_self_attention_without_positions_is_permutation_equivariant():
    """Attention is a set operation: permuting inputs permutes outputs (§3.5 motivation)."""
    x = jax.random.normal(jax.random.key(0), (1, 6, 16))
    mha = MultiHeadAttention(num_heads=4, qk_dim=4, v_dim=4)
    params = nn.unbox(mha.init(jax.random.key(1), x))
    perm = jnp.array([3, 0, 5, 1, 4, 2])
    out = mha.apply(params, x)
    out_perm = mha.apply(params, x[:, perm])
    np.testing.assert_allclose(out_perm, out[:, perm], atol=1e-5)


@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_is_causal_equals_the_causal_mask(impl):
    """``is_causal`` adds §3.2.3's mask to any other: the same output as the combined mask."""
    q, k, v = qkv(q_len=6, kv_len=6)
    keys = padding_mask(jnp.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]]))
    for mask in (None, keys):
        out = scaled_dot_product_attention(q, k, v, mask, is_causal=True, impl=impl)
        expected = scaled_dot_product_attention(q, k, v, combine_masks(mask, causal_mask(6)))
        np.testing.assert_allclose(out, expected, atol=1e-5)


def test_causal_multi_head_attention_equals_the_causal_mask():
    x = jax.random.normal(jax.random.key(0), (2, 5, 16))
    causal = MultiHeadAttention(num_heads=4, qk_dim=4, v_dim=4, causal=True)
    params = nn.unbox(causal.init(jax.random.key(1), x))
    expected = MultiHeadAttention(num_heads=4, qk_dim=4, v_dim=4).apply(
        params, x, mask=causal_mask(5)
    )
    np.testing.assert_allclose(causal.apply(params, x), expected, atol=1e-6)


def test_multi_head_is_concat_of_heads_times_w_o():
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, ...)
    (§3.2.2), from the parameters by hand; they keep their [d_model, heads, d_k] and
    [heads, d_v, d_model] layout."""
    x = jax.random.normal(jax.random.key(0), (2, 5, 16))
    y = jax.random.normal(jax.random.key(2), (2, 7, 16))
    mha = MultiHeadAttention(num_heads=4, qk_dim=3, v_dim=2)
    params = nn.unbox(mha.init(jax.random.key(1), x, y)["params"])
    w_q, w_k = params["query"]["kernel"], params["key"]["kernel"]
    w_v, w_o = params["value"]["kernel"], params["out"]["kernel"]
    chex.assert_shape((w_q, w_k, w_v, w_o), ((16, 4, 3), (16, 4, 3), (16, 4, 2), (4, 2, 16)))
    heads = []
    for i in range(4):
        q, k, v = x @ w_q[:, i], y @ w_k[:, i], y @ w_v[:, i]
        weights = jax.nn.softmax(q @ jnp.swapaxes(k, 1, 2) / np.sqrt(3), axis=-1)
        heads.append(weights @ v)
    expected = jnp.concatenate(heads, axis=-1) @ w_o.reshape(8, 16)
    np.testing.assert_allclose(mha.apply({"params": params}, x, y), expected, atol=1e-5)


def test_multi_head_sows_weights():
    x = jax.random.normal(jax.random.key(0), (2, 5, 16))
    mha = MultiHeadAttention(num_heads=4, qk_dim=4, v_dim=4, sow_weights=True)
    params = nn.unbox(mha.init(jax.random.key(1), x))
    _, state = mha.apply({"params": params["params"]}, x, mutable=["intermediates"])
    (w,) = state["intermediates"]["attention_weights"]
    chex.assert_shape(w, (2, 4, 5, 5))
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)


def test_kv_cache_matches_full_causal_attention():
    x = jax.random.normal(jax.random.key(0), (2, 6, 16))
    full = MultiHeadAttention(num_heads=4, qk_dim=4, v_dim=4)
    params = nn.unbox(full.init(jax.random.key(1), x))
    expected = full.apply(params, x, mask=causal_mask(6))
    cached = MultiHeadAttention(num_heads=4, qk_dim=4, v_dim=4, decode=True)
    cache = nn.unbox(cached.init(jax.random.key(1), x)["cache"])
    steps = []
    for t in range(6):
        out, state = cached.apply(
            {"params": params["params"], "cache": cache}, x[:, t : t + 1], mutable=["cache"]
        )
        cache = state["cache"]
        steps.append(out)
    np.testing.assert_allclose(jnp.concatenate(steps, 1), expected, atol=1e-5)
    assert int(cache["cache_index"]) == 6
    with pytest.raises(ValueError, match="one position"):
        cached.apply({"params": params["params"], "cache": cache}, x[:, :2], mutable=["cache"])


def test_cudnn_key_lengths_form_matches_reference_and_zeroes_keyless_rows(monkeypatch):
    """impl='cudnn' hands cuDNN a key mask as key lengths; a sequence with no key at all
    gets length 1 and zero values. Run on CPU through XLA's implementation of the same call
    (lengths and all; float32 products, as CPUs have no bfloat16 ones): outputs and
    gradients equal the reference's, and the keyless sequence's output and gradients are
    exactly zero."""
    xla = jax.nn.dot_product_attention

    def on_cpu(*args, implementation, **kw):
        return xla(*(x.astype(jnp.float32) for x in args), **kw)

    monkeypatch.setattr(jax.nn, "dot_product_attention", on_cpu)
    q, k, v = qkv(batch=3, q_len=5, kv_len=6)
    mask = padding_mask(jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0] * 6]), 0)

    def loss(impl, q, k, v):
        precision = "bfloat16" if impl == "cudnn" else "float32"
        out = scaled_dot_product_attention(q, k, v, mask, impl=impl, matmul_precision=precision)
        return (out * jnp.arange(out.size).reshape(out.shape) / out.size).sum(), out

    (_, ours), grads = jax.value_and_grad(loss, (1, 2, 3), has_aux=True)("cudnn", q, k, v)
    (_, ref), ref_grads = jax.value_and_grad(loss, (1, 2, 3), has_aux=True)("reference", q, k, v)
    np.testing.assert_allclose(ours, ref, atol=2e-2)
    assert not np.any(np.asarray(ours[2])) and np.any(np.asarray(ours[:2]))
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, atol=5e-2)
        assert not np.any(np.asarray(g[2]))
