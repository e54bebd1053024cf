"""Grouped-query and multi-query attention (the attention pieces ``'grouped_query'`` with
``num_kv_heads``, ``'multi_query'``): the attention function over grouped heads (reference and
fused) equals repeated keys and values, the K/V projections and cache shrink, the model equals
the paper's one whose K/V heads are repeated (so its maps and hidden states are those), equals
the paper's exactly with num_kv_heads = num_heads, and decodes from its cache as the full pass."""

import flax.linen as nn
import jax
import jax._src.cudnn.fused_attention_stablehlo as cudnn_attention
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_CONFIG

import transformer_jax as tj
from transformer_jax.analysis.introspection import attention_maps, hidden_states
from transformer_jax.inference import decoding
from transformer_jax.model.attention import padding_mask, scaled_dot_product_attention
from transformer_jax.model.partitioning import logical_specs

CFG = TINY_CONFIG.replace(  # d_k 4, one layer each
    vocab_size=11, num_heads=4, dropout_rate=0.0, max_len=24, num_encoder_layers=1,
    num_decoder_layers=1,
)  # fmt: skip
GQA = CFG.replace(attention="grouped_query", num_kv_heads=2)
MQA = CFG.replace(attention="multi_query")
SRC = jnp.array([[4, 5, 4, 5, 3], [5, 4, 3, 0, 0], [4, 3, 0, 0, 0]], jnp.int32)
TGT = jnp.array([[2, 4, 7, 9, 5, 3], [2, 10, 4, 4, 0, 0], [2, 6, 3, 0, 0, 0]], jnp.int32)
ATTENTIONS = 3  # encoder self, decoder self and cross


def init(model):
    return nn.unbox(jax.jit(model.init)(jax.random.key(0), SRC, TGT)["params"])


def as_paper(params):
    """The paper's parameters computing the same function: each K/V head repeated for the
    query heads of its group."""

    def repeat(path, x):
        if getattr(path[-2], "key", None) not in ("key", "value"):
            return x
        return jnp.repeat(x, CFG.num_heads // x.shape[1], axis=1)

    return jax.tree_util.tree_map_with_path(repeat, params)


@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_grouped_heads_equal_repeated_keys_and_values(impl):
    q = jax.random.normal(jax.random.key(0), (2, 5, 4, 8))
    k = jax.random.normal(jax.random.key(1), (2, 7, 2, 8))
    v = jax.random.normal(jax.random.key(2), (2, 7, 2, 6))  # d_v != d_k: fused pads
    mask = padding_mask(jnp.array([[5] * 7, [5] * 4 + [0] * 3]))
    repeated = [jnp.repeat(x, 2, axis=2) for x in (k, v)]
    expected = scaled_dot_product_attention(q, *repeated, mask)
    got = jax.jit(lambda *a: scaled_dot_product_attention(*a, mask, impl=impl))(q, k, v)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    if impl == "reference":
        weights = scaled_dot_product_attention(q, k, v, mask, return_weights=True)[1]
        np.testing.assert_allclose(  # float32 rounding: the grouped products differ in shape
            weights,
            scaled_dot_product_attention(q, *repeated, mask, return_weights=True)[1],
            rtol=1e-6,
        )
    with pytest.raises(ValueError, match="q's 4 heads must be groups of k/v's 3 heads"):
        scaled_dot_product_attention(q, k[:, :, :1].repeat(3, 2), v[:, :, :1].repeat(3, 2))


def test_cudnn_takes_grouped_heads_when_lowered_for_cuda(monkeypatch):
    """cuDNN attention over 8 query and 2 K/V heads lowers to its fused custom call."""
    monkeypatch.setattr(cudnn_attention, "check_cudnn_version", lambda: 91000)
    q = jax.ShapeDtypeStruct((2, 64, 8, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 64, 2, 64), jnp.bfloat16)
    attend = lambda q, k, v: scaled_dot_product_attention(q, k, v, impl="cudnn")  # noqa: E731
    lowered = jax.jit(attend).trace(q, kv, kv).lower(lowering_platforms=("cuda",))
    assert "__cudnn$fmhaSoftmax" in lowered.as_text()


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_key_value_projections_and_cache_shrink(kv_heads):
    config = GQA.replace(num_kv_heads=kv_heads) if kv_heads > 1 else MQA
    params, paper = init(tj.Transformer(config)), init(tj.Transformer(CFG))
    attention = params["decoder"]["layer_0"]["cross_attention"]
    d_model, heads, d_k = CFG.d_model, CFG.num_heads, CFG.head_qk_dim
    assert attention["query"]["kernel"].shape == (d_model, heads, d_k)
    assert attention["key"]["kernel"].shape == attention["value"]["kernel"].shape
    assert attention["key"]["kernel"].shape == (d_model, kv_heads, d_k)
    count = lambda tree: sum(x.size for x in jax.tree.leaves(tree))  # noqa: E731
    assert count(paper) - count(params) == ATTENTIONS * 2 * d_model * (heads - kv_heads) * d_k
    _, cache = decoding.transformer_step(tj.Transformer(config), params, SRC, 6)
    assert cache["decoder"]["layer_0"]["self_attention"]["cached_key"].shape == (3, 6, kv_heads, 4)
    specs = logical_specs(lambda: tj.Transformer(config).init(jax.random.key(0), SRC, TGT))
    specs = specs["params"]["encoder"]["layer_0"]["self_attention"]
    assert tuple(specs["key"]["kernel"]) == ("embed", "kv_heads", "kv")
    assert tuple(specs["query"]["kernel"]) == ("embed", "heads", "kv")


@pytest.mark.parametrize(
    "config",
    [
        GQA,
        pytest.param(MQA, marks=pytest.mark.slow),  # also test_variants' multi-query
        pytest.param(
            GQA.replace(positional="rope", scan_layers=True, num_decoder_layers=2),
            marks=pytest.mark.slow,
        ),
    ],
    ids=["grouped_query", "multi_query", "grouped_query-rope-scanned"],
)
def test_cached_decoding_equals_the_full_pass_and_beam_search_runs(config):
    model = tj.Transformer(config)
    params = init(model)
    full = jax.jit(model.apply)({"params": params}, SRC, TGT)
    step, cache = decoding.transformer_step(model, params, SRC, TGT.shape[1])
    step, cached = jax.jit(step), []
    for i in range(TGT.shape[1]):
        logits, cache = step(TGT[:, i : i + 1], cache)
        cached.append(logits[:, -1])
    real = np.asarray(TGT != 0)
    np.testing.assert_allclose(np.asarray(jnp.stack(cached, 1))[real], np.asarray(full)[real],
                               atol=1e-5)  # fmt: skip
    tokens, scores = decoding.beam_search(model, params, SRC, max_extra_len=4, return_all=True)
    assert tokens.shape == (3, 4, 9) and np.isfinite(scores[:, 0]).all()


@pytest.mark.parametrize(
    "config", [GQA, pytest.param(MQA, marks=pytest.mark.slow)], ids=["grouped_query", "multi_query"]
)
def test_the_model_is_the_papers_with_repeated_key_value_heads(config):
    """Logits, every attention map and hidden state equal those of the paper's model given
    each K/V head once per query head of its group; the fused attention gives the same."""
    params = init(tj.Transformer(config))
    paper = as_paper(params)
    logits = tj.Transformer(config).apply({"params": params}, SRC, TGT)
    np.testing.assert_allclose(logits, tj.Transformer(CFG).apply({"params": paper}, SRC, TGT),
                               atol=1e-5)  # fmt: skip
    fused = tj.Transformer(config.replace(attention_impl="fused"))
    np.testing.assert_allclose(fused.apply({"params": params}, SRC, TGT), logits, atol=1e-5)
    models = ((config, params), (CFG, paper))
    maps, paper_maps = (attention_maps(c, p, SRC, TGT) for c, p in models)
    for kind in ("encoder", "decoder_self", "cross"):
        assert maps[kind][0].shape[1] == CFG.num_heads
        np.testing.assert_allclose(maps[kind], paper_maps[kind], atol=1e-5)
    states, paper_states = (hidden_states(c, p, SRC, TGT) for c, p in models)
    np.testing.assert_allclose(states["decoder"], paper_states["decoder"], atol=1e-5)


@pytest.mark.parametrize("kv_heads", [None, 4])
def test_all_heads_is_the_papers_model_exactly(kv_heads):
    paper = tj.Transformer(CFG)
    params = init(paper)
    grouped = tj.Transformer(CFG.replace(attention="grouped_query", num_kv_heads=kv_heads))
    assert jax.tree.map(jnp.shape, init(grouped)) == jax.tree.map(jnp.shape, params)
    np.testing.assert_array_equal(
        jax.jit(grouped.apply)({"params": params}, SRC, TGT),
        jax.jit(paper.apply)({"params": params}, SRC, TGT),
    )


class SilentLayer(nn.Module):
    """An encoder layer of a user's that sows nothing."""

    config: tj.TransformerConfig
    ffn: object = None
    norm: object = None
    score_fn: object = None
    attention: object = None

    @nn.compact
    def __call__(self, x, mask, deterministic=True, where=None):
        return x + nn.Dense(x.shape[-1])(x)


def test_a_layer_that_sows_nothing_is_named_in_one_line():
    model = tj.Transformer(CFG, encoder_layer=SilentLayer)
    params = init(model)
    with pytest.raises(ValueError, match="encoder/layer_0/self_attention sowed no 'attention_"):
        attention_maps(model, params, SRC, TGT)
    with pytest.raises(ValueError, match="encoder/layer_0 sowed no 'hidden_state': each layer"):
        hidden_states(model, params, SRC, TGT)
