"""The model's injection points with the shipped variants (RoPE, ALiBi, SwiGLU / GEGLU,
GELU, RMSNorm, multi-query attention): each is used, cached decoding equals the full pass,
every decoding helper and introspection runs on the module, scanned layers take them, and
relative positions see only the distance between absolute positions (also in packed rows).
The config's names for them (``positional``, ``ffn``, ``norm_type``, ``attention``) build the
same models, parameter trees included; a score hook that carries the positions is given to
a model whose config adds the paper's (no ``positional='none'`` by hand)."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_CONFIG

import transformer_jax as tj
from transformer_jax.analysis.introspection import attention_maps, hidden_states
from transformer_jax.inference import decoding
from transformer_jax.model import registry, variants
from transformer_jax.training.schema import RunConfig

CFG = TINY_CONFIG.replace(vocab_size=11, dropout_rate=0.0, max_len=24)
SRC = jnp.array([[4, 5, 4, 5, 3], [5, 4, 3, 0, 0], [4, 3, 0, 0, 0]], jnp.int32)
TGT = jnp.array([[2, 4, 7, 9, 5, 3], [2, 10, 4, 4, 0, 0], [2, 6, 3, 0, 0, 0]], jnp.int32)
GEGLU = functools.partial(variants.GatedFeedForward, activation=jax.nn.gelu)
VARIANTS = {
    "rope": (CFG, dict(score_fn=variants.rope)),
    "alibi": (CFG, dict(score_fn=variants.alibi)),
    "swiglu-rmsnorm-rope": (
        CFG,
        dict(ffn=variants.GatedFeedForward, norm=variants.rms_norm, score_fn=variants.rope),
    ),
    "geglu-pre-ln": (CFG.replace(norm="pre"), dict(ffn=GEGLU)),
    "gelu-rmsnorm-pre-ln": (
        CFG.replace(norm="pre"),
        dict(ffn=variants.gelu_feed_forward, norm=variants.rms_norm),
    ),
    "multi-query": (CFG, dict(attention=variants.multi_query_attention)),
}
ATOL = 1e-5  # cached against full pass, float32


def init(model, src=SRC, tgt=TGT):
    return nn.unbox(jax.jit(model.init)(jax.random.key(0), src, tgt)["params"])


def shapes(params):
    return jax.tree.map(jnp.shape, params)


def cached_logits(model, params, src=SRC, tgt=TGT):
    """The decoder run one position per call over its cache, every step's logits."""
    step, cache = decoding.transformer_step(model, params, src, tgt.shape[1])
    step = jax.jit(step)
    out = []
    for i in range(tgt.shape[1]):
        logits, cache = step(tgt[:, i : i + 1], cache)
        out.append(logits[:, -1])
    return jnp.stack(out, 1)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if "geglu" in n else n for n in VARIANTS]
)
def test_variant_is_used_and_cached_decoding_equals_the_full_pass(name):
    config, pieces = VARIANTS[name]
    model = tj.Transformer(config, **pieces)
    params = init(model)
    full = jax.jit(model.apply)({"params": params}, SRC, TGT)
    if set(pieces) == {"score_fn"}:  # same parameters as the paper's model, other scores
        stock = jax.jit(tj.Transformer(config).apply)({"params": params}, SRC, TGT)
        assert np.abs(np.asarray(full - stock)).max() > 1e-2
    else:  # other parameters
        assert shapes(params) != shapes(init(tj.Transformer(config)))
    real = np.asarray(TGT != 0)
    np.testing.assert_allclose(np.asarray(cached_logits(model, params))[real],
                               np.asarray(full)[real], atol=ATOL)  # fmt: skip
    tokens, scores = decoding.beam_search(model, params, SRC, max_extra_len=4, return_all=True)
    assert tokens.shape == (3, 4, 9) and np.isfinite(scores[:, 0]).all()


def test_greedy_and_sampling_take_the_module():
    model = tj.Transformer(CFG, score_fn=variants.rope)
    params = init(model)
    greedy = decoding.greedy_search(model, params, SRC, max_extra_len=4)
    np.testing.assert_array_equal(
        greedy, decoding.beam_search(model, params, SRC, beam_size=1, alpha=0.0, max_extra_len=4)
    )
    stock = decoding.greedy_search(CFG, params, SRC, max_extra_len=4)
    assert not np.array_equal(greedy, stock)  # the module's scores, not the config's
    sampled = decoding.temperature_sample(model, params, SRC, jax.random.key(1), max_extra_len=4)
    assert sampled.shape == (3, 9) and int(sampled.max()) < CFG.vocab_size


@pytest.mark.parametrize("score_fn", [variants.rope, variants.alibi])
def test_relative_scores_see_distances_between_absolute_positions(score_fn):
    """Shifting every position leaves the output unchanged; permuting the tokens does not
    permute it (the model is no longer permutation-equivariant)."""
    encoder = tj.Encoder(CFG, score_fn=score_fn)
    x = SRC[:1]
    params = nn.unbox(encoder.init(jax.random.key(0), x)["params"])
    out = encoder.apply({"params": params}, x)
    shifted = encoder.apply({"params": params}, x, positions=jnp.arange(5)[None] + 7)
    np.testing.assert_allclose(shifted, out, atol=1e-5)
    perm = np.array([2, 0, 4, 1, 3])
    permuted = encoder.apply({"params": params}, x[:, perm])
    assert np.abs(np.asarray(permuted - out[:, perm])).max() > 1e-3


def test_packed_row_equals_separate_rows_with_rope():
    """Positions restart and segments separate the sequences packed in one row."""
    decoder = tj.Decoder(CFG, score_fn=variants.rope)
    a, b = jnp.array([[2, 4, 7, 9]]), jnp.array([[2, 5, 6]])
    params = nn.unbox(decoder.init(jax.random.key(0), a)["params"])
    packed = decoder.apply(
        {"params": params},
        jnp.concatenate([a, b], 1),
        tgt_segments=jnp.array([[1, 1, 1, 1, 2, 2, 2]]),
        tgt_positions=jnp.array([[0, 1, 2, 3, 0, 1, 2]]),
    )
    alone = jnp.concatenate([decoder.apply({"params": params}, t) for t in (a, b)], 1)
    np.testing.assert_allclose(packed, alone, atol=1e-5)


def test_scanned_layers_take_the_pieces():
    pieces = dict(ffn=variants.GatedFeedForward, norm=variants.rms_norm, score_fn=variants.rope)
    unrolled = tj.Transformer(CFG, **pieces)
    scanned = tj.Transformer(CFG.replace(scan_layers=True), **pieces)
    params = init(unrolled)

    def stack(tree):
        layers = [tree.pop(f"layer_{i}") for i in range(CFG.num_encoder_layers)]
        return {**tree, "layers": jax.tree.map(lambda *x: jnp.stack(x), *layers)}

    stacked = {**params, "encoder": stack(dict(params["encoder"]))}
    stacked["decoder"] = stack(dict(params["decoder"]))
    full = scanned.apply({"params": stacked}, SRC, TGT)
    np.testing.assert_allclose(full, unrolled.apply({"params": params}, SRC, TGT), atol=1e-5)
    real = np.asarray(TGT != 0)
    np.testing.assert_allclose(np.asarray(cached_logits(scanned, stacked))[real],
                               np.asarray(full)[real], atol=ATOL)  # fmt: skip
    assert decoding.beam_search(scanned, stacked, SRC, max_extra_len=3).shape == (3, 8)


def test_attention_maps_are_the_given_modules():
    """The compiled pass is keyed on the module: each score hook gives its own maps."""
    params = init(tj.Transformer(CFG))
    maps = {
        name: attention_maps(model, params, SRC, TGT)["decoder_self"][0]
        for name, model in [
            ("paper", CFG),
            ("rope", tj.Transformer(CFG, score_fn=variants.rope)),
            ("alibi", tj.Transformer(CFG, score_fn=variants.alibi)),
        ]
    }
    assert np.abs(maps["rope"] - maps["paper"]).max() > 1e-3
    assert np.abs(maps["alibi"] - maps["rope"]).max() > 1e-3
    again = attention_maps(CFG, params, SRC, TGT)["decoder_self"][0]
    np.testing.assert_array_equal(again, maps["paper"])


def test_hidden_states_end_in_the_logits():
    model = tj.Transformer(CFG, norm=variants.rms_norm)
    params = init(model)
    states = hidden_states(model, params, SRC, TGT)
    assert list(jax.eval_shape(model.init, jax.random.key(0), SRC, TGT)) == ["params"]
    assert [len(states[s]) for s in ("encoder", "decoder")] == [3, 3]
    assert states["encoder"][0].shape == (3, 5, CFG.d_model)
    embedding = params["shared_embed"]["embedding"]
    logits = model.apply({"params": params}, SRC, TGT)
    np.testing.assert_allclose(states["decoder"][-1] @ embedding.T, logits, atol=1e-4)


def test_inputs_embeds_equal_the_ids_path():
    model = tj.Transformer(CFG)
    params = init(model)
    embed = lambda ids: params["shared_embed"]["embedding"][ids] * CFG.d_model**0.5  # noqa: E731
    logits = model.apply({"params": params}, SRC, TGT)
    from_embeds = model.apply(
        {"params": params}, SRC, TGT, src_embeds=embed(SRC), tgt_embeds=embed(TGT)
    )
    np.testing.assert_allclose(from_embeds, logits, atol=1e-6)
    decoder = tj.Decoder(CFG)
    dparams = nn.unbox(decoder.init(jax.random.key(0), TGT[:1])["params"])
    ids = decoder.apply({"params": dparams}, TGT[:1])
    rows = dparams["embed"]["embedding"][TGT[:1]] * CFG.d_model**0.5
    np.testing.assert_allclose(decoder.apply({"params": dparams}, None, inputs_embeds=rows), ids,
                               atol=1e-6)  # fmt: skip


def test_params_of_another_config_name_the_mismatch():
    params = init(tj.Transformer(CFG))
    mismatch = r"params do not match the model .*ffn/w1/bias' is \(32,\), the model's \(64,\)"
    with pytest.raises(ValueError, match=mismatch):
        decoding.beam_search(CFG.replace(d_ff=64), params, SRC)
    with pytest.raises(ValueError, match="has no 'decoder/layer_0/ffn/gate/kernel'"):
        decoding.greedy_search(tj.Transformer(CFG, ffn=variants.GatedFeedForward), params, SRC)


BASE = CFG
GLU = functools.partial(variants.GatedFeedForward, activation=jax.nn.sigmoid)
NAMED = {  # config field -> the pieces given to the module for the same model
    "positional=rope": (dict(positional="rope"), CFG, dict(score_fn=variants.rope)),
    "positional=alibi": (dict(positional="alibi"), CFG, dict(score_fn=variants.alibi)),
    "ffn=gelu": (dict(ffn="gelu"), BASE, dict(ffn=variants.gelu_feed_forward)),
    "ffn=glu": (dict(ffn="glu"), BASE, dict(ffn=GLU)),
    "ffn=geglu": (dict(ffn="geglu"), BASE, dict(ffn=GEGLU)),
    "ffn=swiglu": (dict(ffn="swiglu"), BASE, dict(ffn=variants.GatedFeedForward)),
    "norm_type=rms": (
        dict(norm_type="rms", norm="pre"),
        BASE.replace(norm="pre"),
        dict(norm=variants.rms_norm),
    ),
    "attention=multi_query": (
        dict(attention="multi_query"),
        BASE,
        dict(attention=variants.multi_query_attention),
    ),
}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in ("ffn=glu", "ffn=gelu") else n for n in NAMED],
)
def test_a_named_variant_is_its_module_trains_and_decodes_over_its_cache(name):
    """``TransformerConfig(positional=..., ffn=..., norm_type=...)`` builds the model the
    variant's module gives, one train step moves every parameter, and cached decoding
    equals the full pass."""
    fields, config, pieces = NAMED[name]
    named = tj.Transformer(BASE.replace(**fields))
    params = init(named)
    full = jax.jit(named.apply)({"params": params}, SRC, TGT)
    given_model = tj.Transformer(config, **pieces)
    assert shapes(init(given_model)) == shapes(params)  # the same tree by name or by module
    given = jax.jit(given_model.apply)({"params": params}, SRC, TGT)
    np.testing.assert_allclose(given, full, atol=1e-6)
    if shapes(params) == shapes(init(tj.Transformer(BASE))):
        paper = tj.Transformer(BASE).apply({"params": params}, SRC, TGT)
        assert np.abs(np.asarray(full - paper)).max() > 1e-3  # not the paper's model
    real = np.asarray(TGT != 0)
    np.testing.assert_allclose(np.asarray(cached_logits(named, params))[real],
                               np.asarray(full)[real], atol=ATOL)  # fmt: skip

    batch = tj.training.make_batch(SRC.tolist(), TGT.tolist())
    tx = tj.training.transformer_optimizer(tj.training.transformer_schedule(CFG.d_model, 10))
    state = tj.training.create_train_state(params, tx, jax.random.key(1))
    state, metrics = jax.jit(functools.partial(tj.training.train_step, model=named))(state, batch)
    assert np.isfinite(float(metrics["loss"]))
    moved = jax.tree.map(lambda a, b: bool(np.any(a != b)), params, state.params)
    assert all(jax.tree.leaves(moved))


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(ffn="reglu"), r"ffn must be one of \('relu', 'gelu', 'glu', 'geglu', 'swiglu'\)"),
        (dict(norm_type="batch"), r"norm_type must be one of \('layer', 'rms'\)"),
        (dict(positional="rotary"), "positional must be one of"),
        (dict(positional="alibi", attention_impl="fused"), "needs attention_impl='reference'"),
        (dict(positional="rope", qk_dim=7, v_dim=8), "needs an even d_k, got 7"),
        (dict(attention="mqa"), r"attention must be one of \('multi_head', 'grouped_query',"),
        (dict(num_kv_heads=1), "attention='multi_head' has num_heads K/V heads: num_kv_heads=1"),
        (dict(attention="multi_query", num_kv_heads=2), "'multi_query' has one K/V head"),
        (dict(attention="grouped_query", num_kv_heads=3), "num_kv_heads=3 must divide num_heads"),
    ],
)
def test_an_unknown_or_unfit_name_is_one_line(fields, match):
    with pytest.raises(ValueError, match=match) as error:
        BASE.replace(**fields)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=match):  # as train.py reads config.model
        RunConfig.from_config({"model": {**dataclasses.asdict(BASE), **fields}})


@pytest.mark.parametrize(
    "config, pieces, match",
    [
        (BASE.replace(qk_dim=7, v_dim=8), dict(score_fn=variants.rope), "needs an even d_k, got 7"),
        (BASE.replace(attention_impl="fused"), dict(score_fn=variants.alibi), "'reference'"),
        (BASE.replace(attention_impl="fused"), dict(score_fn=lambda *a: 0), "score_fn=<lambda>"),
    ],
)
def test_a_given_piece_is_checked_by_the_rules_of_its_name(config, pieces, match):
    with pytest.raises(ValueError, match=match) as error:
        tj.Transformer(config, **pieces).init(jax.random.key(0), SRC, TGT)
    assert "\n" not in str(error.value)


def test_every_shipped_name_resolves_and_a_given_module_wins():
    assert registry.names("ffn") == ("relu", "gelu", "glu", "geglu", "swiglu")
    assert registry.names("norm") == ("layer", "rms")
    assert registry.names("positional") == ("sinusoidal", "learned", "none", "rope", "alibi")
    assert registry.names("attention") == ("multi_head", "grouped_query", "multi_query")
    for kind, field in registry.FIELDS.items():
        for name in registry.names(kind):
            assert registry.named(BASE.replace(**{field: name}))[kind].name == name
    given = jax.eval_shape(
        tj.Transformer(BASE.replace(ffn="swiglu"), ffn=tj.FeedForward).init,
        jax.random.key(0), SRC, TGT,
    )  # fmt: skip
    assert set(given["params"]["encoder"]["layer_0"]["ffn"]) == {"w1", "w2"}
