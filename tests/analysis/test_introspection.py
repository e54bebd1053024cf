"""introspection.attention_maps: shapes and the properties of softmax attention weights."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_CONFIG

from transformer_jax import MultiHeadAttention, Transformer
from transformer_jax.analysis.introspection import attention_maps

CFG = TINY_CONFIG.replace(vocab_size=13, num_heads=4, num_decoder_layers=3, max_len=16)
# Row 0 has one padding token at the end of each side; row 1 has none.
SRC = jnp.array([[5, 6, 7, 8, 3, 0], [4, 5, 6, 7, 8, 3]], jnp.int32)
TGT = jnp.array([[2, 9, 10, 11, 0], [2, 9, 10, 11, 12]], jnp.int32)


@pytest.fixture(scope="module")
def params():
    return nn.unbox(jax.jit(Transformer(CFG).init)(jax.random.key(0), SRC, TGT)["params"])


@pytest.fixture(scope="module")
def maps(params):
    return attention_maps(CFG, params, SRC, TGT)


def test_shapes_per_layer_and_head(maps):
    assert [len(maps[k]) for k in ("encoder", "decoder_self", "cross")] == [2, 3, 3]
    assert all(m.shape == (2, 4, 6, 6) for m in maps["encoder"])
    assert all(m.shape == (2, 4, 5, 5) for m in maps["decoder_self"])
    assert all(m.shape == (2, 4, 5, 6) for m in maps["cross"])
    assert all(isinstance(m, np.ndarray) and m.dtype == np.float32 for m in maps["cross"])


def test_rows_sum_to_one(maps):
    for kind in ("encoder", "decoder_self", "cross"):
        for m in maps[kind]:
            np.testing.assert_allclose(m.sum(-1), 1.0, atol=1e-5)


def test_decoder_self_attention_is_zero_in_the_future(maps):
    future = np.triu(np.ones((5, 5), bool), k=1)
    for m in maps["decoder_self"]:
        assert np.all(m[..., future] == 0.0)
        assert np.all(m[1][..., ~future] > 0.0)  # unpadded row: the past is all visible


def test_padding_keys_get_zero_weight(maps):
    for m in maps["encoder"] + maps["cross"]:
        assert np.all(m[0, ..., 5] == 0.0)  # source pad
        assert np.all(m[1, ..., 5] > 0.0)
    for m in maps["decoder_self"]:
        assert np.all(m[0, ..., 4] == 0.0)  # target pad


def test_accepts_variables_and_a_fused_config(params):
    """The maps of a fused model (given its variables) are its attention weights, computed
    here by hand from the inputs each attention layer receives in that model's own pass."""
    fused = CFG.replace(attention_impl="fused")
    seen = {}

    def record(next_fun, args, kwargs, context):
        if isinstance(context.module, MultiHeadAttention) and context.method_name == "__call__":
            inputs_kv = args[1] if len(args) > 1 else kwargs.get("inputs_kv")
            seen[context.module.path] = (args[0], inputs_kv, kwargs.get("mask"))
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        Transformer(fused).apply({"params": params}, SRC, TGT)
    maps = attention_maps(fused, {"params": params}, SRC, TGT)
    for (stack, layer, name), got in [
        (("encoder", "layer_1", "self_attention"), maps["encoder"][1]),
        (("decoder", "layer_2", "cross_attention"), maps["cross"][2]),
    ]:
        x_q, x_kv, mask = seen[(stack, layer, name)]
        x_kv = x_q if x_kv is None else x_kv
        p = params[stack][layer][name]
        q = np.einsum("btd,dhk->bhtk", x_q, p["query"]["kernel"])
        k = np.einsum("bsd,dhk->bhsk", x_kv, p["key"]["kernel"])
        scores = np.where(mask, q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1]), -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        np.testing.assert_allclose(got, weights / weights.sum(-1, keepdims=True), atol=1e-5)
