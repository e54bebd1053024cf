"""``torch.nn.Transformer`` interop: the config switches it needs (attention biases, final
norms, LayerNorm eps) decode from the cache as the full pass does; ``to_torch`` /
``from_torch`` round-trip exactly; a default ``nn.Transformer``'s outputs (post- and pre-LN,
causal and key padding masks) are reproduced at 1e-5 from the fixture torch wrote
(make_torch_fixture.py), and from live torch where it is installed; what cannot map is
refused in one line."""

from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_jax as tj
from transformer_jax.inference import decoding
from transformer_jax.interop import torch as interop

HERE = Path(__file__).parent
SIZES = dict(vocab_size=11, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=2,
             num_decoder_layers=2, dropout_rate=0.0)  # fmt: skip
TORCH_LIKE = tj.TransformerConfig(
    **SIZES, attention_bias=True, final_norm=True, layer_norm_eps=1e-5
)
SRC = jnp.array([[4, 5, 6, 7, 3], [5, 4, 3, 0, 0]], jnp.int32)
TGT = jnp.array([[2, 4, 7, 9, 5, 3], [2, 10, 4, 0, 0, 0]], jnp.int32)
ATOL = 1e-5


def init(config, seed=0, noise=0.0):
    """Initial parameters, plus ``noise`` x N(0, 1) (biases and norms are 0 / 1 at first)."""
    params = nn.unbox(
        jax.jit(tj.Transformer(config).init)(jax.random.key(seed), SRC, TGT)["params"]
    )
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    noisy = [p + noise * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys, strict=True)]
    return jax.tree.unflatten(tree, noisy)


def fixture(name):
    case = np.load(HERE / f"torch_transformer_{name}.npz")
    return {key: case[key] for key in case.files}


def state_dict(case):
    return {k[len("torch.") :]: v for k, v in case.items() if k.startswith("torch.")}


def load(case, **kwargs):
    return interop.from_torch(
        state_dict(case),
        nhead=2,
        norm_first=bool(case["norm_first"]),
        src_embedding=case["embedding"],
        output_weight=case["output_weight"],
        output_bias=case["output_bias"],
        **kwargs,
    )


def assert_reproduces(case):
    config, params = load(case)
    model = tj.Transformer(config)
    memory = model.apply({"params": params}, case["src"], method=tj.Transformer.encode)
    np.testing.assert_allclose(np.asarray(memory), case["memory"], atol=ATOL, rtol=0)
    logits = model.apply({"params": params}, case["src"], case["tgt"])
    np.testing.assert_allclose(np.asarray(logits), case["logits"], atol=ATOL, rtol=0)


@pytest.mark.parametrize("norm", ["post", pytest.param("pre", marks=pytest.mark.slow)])
def test_switches_are_used_and_cached_decoding_equals_the_full_pass(norm):
    config = TORCH_LIKE.replace(norm=norm, ffn_bias=False)
    params = init(config)
    for stack in ("encoder", "decoder"):
        layer = params[stack]["layer_0"]
        assert "final_norm" in params[stack] and "bias" not in layer["ffn"]["w1"]
        assert set(layer["self_attention"]["out"]) == {"kernel", "bias"}
    model = tj.Transformer(config)
    full = np.asarray(jax.jit(model.apply)({"params": params}, SRC, TGT))
    for other in (config.replace(layer_norm_eps=1e-6), config.replace(final_norm=False)):
        changed = jax.jit(tj.Transformer(other).apply)({"params": params}, SRC, TGT)
        assert np.abs(np.asarray(changed) - full).max() > 1e-6
    step, cache = decoding.transformer_step(model, params, SRC, TGT.shape[1])
    step, cached = jax.jit(step), []
    for i in range(TGT.shape[1]):
        logits, cache = step(TGT[:, i : i + 1], cache)
        cached.append(logits[:, -1])
    real = np.asarray(TGT != 0)
    np.testing.assert_allclose(np.asarray(jnp.stack(cached, 1))[real], full[real], atol=ATOL)
    tokens, scores = decoding.beam_search(model, params, SRC, max_extra_len=4, return_all=True)
    assert tokens.shape == (2, 4, 9) and np.isfinite(scores[:, 0]).all()


def test_the_defaults_are_the_papers():
    params = init(TORCH_LIKE.replace(attention_bias=False, final_norm=None, layer_norm_eps=1e-6))
    assert tj.TransformerConfig().layer_norm_eps == 1e-6 and "final_norm" not in params["encoder"]
    assert set(params["encoder"]["layer_0"]["self_attention"]["query"]) == {"kernel"}
    assert set(params["encoder"]["layer_0"]["ffn"]["w1"]) == {"kernel", "bias"}  # Eq. 2
    assert "final_norm" in init(TORCH_LIKE.replace(norm="pre", final_norm=None))["encoder"]


@pytest.mark.parametrize(
    "changes",
    [
        dict(final_norm=True),  # the paper's post-LN: no attention biases (exported as zeros)
        dict(norm="pre", ffn_bias=False),
        dict(
            attention_bias=True,
            final_norm=True,
            scan_layers=True,
            share_embeddings=False,
            tie_output=False,
            tgt_vocab_size=9,
        ),  # fmt: skip
    ],
)
def test_to_torch_then_from_torch_gives_the_params_back_exactly(changes):
    config = tj.TransformerConfig(**SIZES).replace(**changes)
    params = init(config, seed=1, noise=0.3)
    state = interop.to_torch(params, config, numpy=True)
    assert len(state) == 64 and state["encoder.layers.0.self_attn.in_proj_weight"].shape == (48, 16)
    outside = interop.embeddings(params, config)
    pre = config.norm == "pre"
    eps = config.layer_norm_eps
    _, back = interop.from_torch(state, config, norm_first=pre, layer_norm_eps=eps, **outside)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    jax.tree.map(np.testing.assert_array_equal, back, params)
    read, again = interop.from_torch(state, nhead=2, norm_first=pre, layer_norm_eps=eps, **outside)
    assert (read.share_embeddings, read.tie_output) == (config.share_embeddings, config.tie_output)
    assert (read.norm, read.final_norm, read.layer_norm_eps) == (config.norm, True, eps)
    assert read.attention_bias and read.ffn_bias  # torch's bias=True: zeros where absent
    assert read.tgt_vocab == config.tgt_vocab
    np.testing.assert_array_equal(
        again["decoder"]["layer_0"]["cross_attention"]["key"]["kernel"],
        state["decoder.layers.0.multihead_attn.in_proj_weight"][16:32].T.reshape(16, 2, 8),
    )


@pytest.mark.parametrize("name", ["post", "pre"])
def test_a_default_torch_transformer_is_reproduced_from_its_fixture(name):
    case = fixture(name)
    assert_reproduces(case)
    config, params = load(case)
    assert config.attention_bias and config.final_norm and config.layer_norm_eps == 1e-5
    assert config.norm == name and not config.tie_output and config.share_embeddings
    jax.tree.map(
        np.testing.assert_array_equal,
        interop.to_torch(params, config, numpy=True),
        state_dict(case),
    )


def test_what_cannot_map_is_refused_in_one_line():
    case = fixture("post")
    config, _ = load(case)
    refused = {
        "activation='gelu' does not map": dict(activation="gelu"),
        "norm_first=True does not match config.norm='post'": dict(config=config, norm_first=True),
        "layer_norm_eps=1e-06 does not match": dict(config=config, layer_norm_eps=1e-6),
        r"linear1.weight of shape \(32, 16\) does not fit": dict(config=config.replace(d_ff=64)),
        "lacks decoder.layers.2": dict(config=config.replace(num_decoder_layers=3)),
        "in_proj_bias is not zero: the config needs attention_bias=True": dict(
            config=config.replace(attention_bias=False)
        ),
        "set final_norm=True": dict(config=config.replace(final_norm=False)),
        "nhead=2 does not match config.num_heads=4": dict(config=config.replace(num_heads=4)),
        "takes .'output_bias', 'output_weight', 'src_embedding'.": dict(
            config=config, tgt_embedding=[[0.0]]
        ),
        "has the paper's pieces, not ffn='swiglu'": dict(config=config.replace(ffn="swiglu")),
        "not attention='multi_query'": dict(config=config.replace(attention="multi_query")),
        "not positional='rope'": dict(config=config.replace(positional="rope")),
    }
    for message, kwargs in refused.items():
        kwargs = {"nhead": 2, "norm_first": False} | kwargs
        with pytest.raises(ValueError, match=message):
            interop.from_torch(state_dict(case), output_weight=case["output_weight"], **kwargs)
    with pytest.raises(ValueError, match=r"do not map: \['extra.weight'\]"):
        interop.from_torch(state_dict(case) | {"extra.weight": np.zeros(1)}, nhead=2, vocab_size=11)
    with pytest.raises(ValueError, match="needs nhead"):
        interop.from_torch(state_dict(case), vocab_size=11)
    with pytest.raises(ValueError, match="ends each stack in a LayerNorm"):
        interop.to_torch(init(tj.TransformerConfig(**SIZES)), tj.TransformerConfig(**SIZES))


@pytest.mark.parametrize("norm_first", [False, True])
def test_live_torch_is_reproduced_both_ways(norm_first):
    torch = pytest.importorskip("torch")
    from make_torch_fixture import make_case

    assert_reproduces(make_case(norm_first, seed=1))
    config = TORCH_LIKE.replace(norm="pre" if norm_first else "post", ffn_bias=False)
    params = init(config, seed=2, noise=0.3)
    module = torch.nn.Transformer(**interop.torch_options(config))
    module.load_state_dict(interop.to_torch(params, config))
    module.eval()
    outside = interop.embeddings(params, config)
    _, back = interop.from_torch(module.state_dict(), config, norm_first=norm_first, **outside)
    jax.tree.map(np.testing.assert_array_equal, back, params)  # from torch tensors
    embedded = lambda ids: jnp.take(params["shared_embed"]["embedding"], ids, 0) * 4.0  # noqa: E731
    src, tgt = (
        torch.from_numpy(np.array(embedded(ids) + tj.sinusoidal_positions(8, 16)[: ids.shape[1]]))
        for ids in (SRC, TGT)
    )
    out = module(
        src,
        tgt,
        tgt_mask=torch.triu(torch.ones(6, 6, dtype=torch.bool), 1),
        src_key_padding_mask=torch.from_numpy(np.array(SRC == 0)),
        tgt_key_padding_mask=torch.from_numpy(np.array(TGT == 0)),
        memory_key_padding_mask=torch.from_numpy(np.array(SRC == 0)),
    )
    logits = out.detach().numpy() @ np.asarray(params["shared_embed"]["embedding"]).T
    ours = tj.Transformer(config).apply({"params": params}, SRC, TGT)
    np.testing.assert_allclose(np.asarray(ours), logits, atol=ATOL, rtol=0)


def test_to_torch_takes_init_output_boxed_or_plain():
    boxed = jax.jit(tj.Transformer(TORCH_LIKE).init)(jax.random.key(0), SRC, TGT)["params"]
    from_boxed = interop.to_torch(boxed, TORCH_LIKE, numpy=True)
    from_plain = interop.to_torch(init(TORCH_LIKE), TORCH_LIKE, numpy=True)
    assert from_boxed.keys() == from_plain.keys()
    for key, value in from_plain.items():
        np.testing.assert_array_equal(from_boxed[key], value, err_msg=key)
