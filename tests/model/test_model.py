"""The encoder-decoder Transformer: shapes, masks, parameter counts, norms, configuration."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import TINY_CONFIG

from transformer_jax import Decoder, Encoder, Transformer, TransformerConfig
from transformer_jax.model.layers import EncoderLayer
from transformer_jax.training.schema import RunConfig, default_config

TINY = TINY_CONFIG.replace(vocab_size=40, d_model=32, num_heads=4, d_ff=64)


def tokens(shape, seed, low=4, high=40):
    return jax.random.randint(jax.random.key(seed), shape, low, high)


def init(cfg, src, tgt, seed=0):
    return nn.unbox(jax.jit(Transformer(cfg).init)(jax.random.key(seed), src, tgt)["params"])


def applier(cfg):
    """Jitted ``Transformer(cfg).apply`` (eager op-by-op dispatch is slow on CPU)."""
    return jax.jit(Transformer(cfg).apply, static_argnames=("method", "deterministic"))


class TestShapes(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_logits_shape_and_dtype(self):
        for dtype in (jnp.float32, jnp.bfloat16):
            cfg = TINY.replace(dtype=dtype)
            src, tgt = tokens((3, 7), 0), tokens((3, 5), 1)
            params = init(cfg, src, tgt)
            model = Transformer(cfg)
            logits = self.variant(lambda p, s, t, m=model: m.apply({"params": p}, s, t))(
                params, src, tgt
            )
            chex.assert_shape(logits, (3, 5, 40))
            chex.assert_type(logits, jnp.float32)
            chex.assert_tree_all_finite(logits)
            chex.assert_trees_all_equal_dtypes(
                params, jax.tree.map(lambda x: x.astype(jnp.float32), params)
            )

    @chex.variants(with_jit=True, without_jit=True)
    def test_encode_decode_halves(self):
        src, tgt = tokens((2, 6), 0), tokens((2, 4), 1)
        params = init(TINY, src, tgt)
        m = Transformer(TINY)
        enc = self.variant(lambda p, s: m.apply({"params": p}, s, method="encode"))(params, src)
        chex.assert_shape(enc, (2, 6, 32))
        logits = m.apply({"params": params}, enc, src, tgt, method="decode")
        np.testing.assert_allclose(logits, m.apply({"params": params}, src, tgt), atol=1e-5)


def test_causal_mask_hides_the_future():
    """Changing target tokens after t leaves the decoder outputs at positions <= t unchanged."""
    src, tgt = tokens((2, 6), 0), tokens((2, 8), 1)
    params = init(TINY, src, tgt)
    m = applier(TINY)
    base = m({"params": params}, src, tgt)
    t = 3
    changed = tgt.at[:, t + 1 :].set(tokens((2, 8 - t - 1), 9))
    out = m({"params": params}, src, changed)
    np.testing.assert_allclose(out[:, : t + 1], base[:, : t + 1], atol=1e-5)
    assert not np.allclose(out[:, t + 1 :], base[:, t + 1 :])


def test_padding_is_invisible():
    """Extra source padding changes neither the non-pad encoder outputs nor the logits."""
    src, tgt = tokens((2, 5), 0), tokens((2, 4), 1)
    src = src.at[0, 3:].set(0)
    params = init(TINY, src, tgt)
    m = applier(TINY)
    padded = jnp.pad(src, ((0, 0), (0, 4)))
    np.testing.assert_allclose(
        m({"params": params}, padded, tgt), m({"params": params}, src, tgt), atol=1e-5
    )
    enc = m({"params": params}, src, method="encode")
    enc_padded = m({"params": params}, padded, method="encode")
    np.testing.assert_allclose(enc_padded[0, :3], enc[0, :3], atol=1e-5)
    np.testing.assert_allclose(enc_padded[1, :5], enc[1], atol=1e-5)


def test_packed_sequences_equal_separate_ones():
    """Segment ids and per-segment positions make a packed row behave as separate rows."""
    a_src, b_src = tokens((1, 3), 0), tokens((1, 4), 1)
    a_tgt, b_tgt = tokens((1, 2), 2), tokens((1, 3), 3)
    params = init(TINY, a_src, a_tgt)
    m = applier(TINY)
    packed = m(
        {"params": params},
        jnp.concatenate([a_src, b_src, jnp.zeros((1, 1), jnp.int32)], 1),
        jnp.concatenate([a_tgt, b_tgt], 1),
        src_segments=jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]]),
        tgt_segments=jnp.array([[1, 1, 2, 2, 2]]),
        src_positions=jnp.array([[0, 1, 2, 0, 1, 2, 3, 0]]),
        tgt_positions=jnp.array([[0, 1, 0, 1, 2]]),
    )
    np.testing.assert_allclose(packed[:, :2], m({"params": params}, a_src, a_tgt), atol=1e-5)
    np.testing.assert_allclose(packed[:, 2:], m({"params": params}, b_src, b_tgt), atol=1e-5)


def test_encoder_layer_is_permutation_equivariant():
    """Without positional encodings self-attention cannot tell token order (§3.5)."""
    x = jax.random.normal(jax.random.key(0), (1, 6, 32))
    layer = EncoderLayer(TINY)
    params = nn.unbox(layer.init(jax.random.key(1), x, None))
    perm = jnp.array([2, 5, 0, 4, 1, 3])
    np.testing.assert_allclose(
        layer.apply(params, x[:, perm], None), layer.apply(params, x, None)[:, perm], atol=1e-5
    )


def test_cached_decoding_equals_full_decoding():
    src, tgt = tokens((2, 6), 0), tokens((2, 5), 1)
    src = src.at[1, 4:].set(0)
    params = init(TINY, src, tgt)
    full = applier(TINY)({"params": params}, src, tgt)
    dm = Transformer(TINY.replace(decode=True))
    cache = nn.unbox(dm.init(jax.random.key(0), src, jnp.zeros((2, 9), jnp.int32))["cache"])
    enc = dm.apply({"params": params}, src, method="encode")
    steps = []
    for t in range(5):
        logits, state = dm.apply(
            {"params": params, "cache": cache}, enc, src, tgt[:, t : t + 1],
            method="decode", mutable=["cache"],
        )  # fmt: skip
        cache = state["cache"]
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, 1), full, atol=1e-5)


def count(params):
    return sum(x.size for x in jax.tree.leaves(params))


@pytest.mark.parametrize(
    "name, overrides, paper_millions",
    [("base", {}, 65), ("big", dict(d_model=1024, num_heads=16, d_ff=4096), 213)],
)
def test_parameter_counts_match_table_3(name, overrides, paper_millions):
    """Table 3: base 65M, big 213M (37,000-token shared vocabulary, tied softmax weights).

    The real initialised parameters (shapes only, via eval_shape): base 63.05M, big 214.2M.
    """
    cfg = TransformerConfig(**overrides)
    src = jnp.ones((1, 4), jnp.int32)
    shapes = jax.eval_shape(lambda: Transformer(cfg).init(jax.random.key(0), src, src))
    n = count(shapes["params"])
    assert abs(n / 1e6 - paper_millions) / paper_millions <= 0.031, (name, n)
    embedding = 37000 * cfg.d_model
    per_encoder = 4 * cfg.d_model**2 + 2 * cfg.d_model * cfg.d_ff + cfg.d_ff + 5 * cfg.d_model
    per_decoder = per_encoder + 4 * cfg.d_model**2 + 2 * cfg.d_model
    assert n == embedding + 6 * per_encoder + 6 * per_decoder


def test_untied_and_separate_vocabularies():
    cfg = TINY.replace(
        share_embeddings=False, tie_output=False, src_vocab_size=30, tgt_vocab_size=50
    )
    src, tgt = tokens((2, 5), 0, high=30), tokens((2, 4), 1, high=50)
    params = init(cfg, src, tgt)
    assert params["src_embed"]["embedding"].shape == (30, 32)
    assert params["tgt_embed"]["embedding"].shape == (50, 32)
    assert params["decoder"]["logits"]["kernel"].shape == (32, 50)
    assert applier(cfg)({"params": params}, src, tgt).shape == (2, 4, 50)


def test_shared_embedding_is_one_matrix():
    src, tgt = tokens((2, 5), 0), tokens((2, 4), 1)
    params = init(TINY, src, tgt)
    assert set(params) == {"shared_embed", "encoder", "decoder"}
    assert "embed" not in params["encoder"] and "logits" not in params["decoder"]


def test_encoder_only_and_decoder_only_stacks():
    src = tokens((2, 6), 0)
    enc = Encoder(TINY)
    out = nn.unbox(enc.apply(enc.init(jax.random.key(0), src), src))
    assert out.shape == (2, 6, 32)
    lm = Decoder(TINY)
    variables = nn.unbox(lm.init(jax.random.key(0), src))
    assert "cross_attention" not in variables["params"]["layer_0"]
    assert lm.apply(variables, src).shape == (2, 6, 40)


def test_post_ln_and_pre_ln_differ_and_are_finite():
    src, tgt = tokens((2, 6), 0), tokens((2, 5), 1)
    outs = {}
    for norm in ("post", "pre"):
        cfg = TINY.replace(norm=norm)
        params = init(cfg, src, tgt)
        outs[norm] = applier(cfg)({"params": params}, src, tgt)
        assert jnp.isfinite(outs[norm]).all()
        assert ("final_norm" in params["encoder"]) == (norm == "pre")
    assert not np.allclose(outs["post"], outs["pre"])


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_both_norms_learn_a_copy_task(norm):
    """Loss on a tiny copy task (target = source) drops well within 300 steps."""
    cfg = TINY.replace(
        norm=norm, vocab_size=12, dropout_rate=0.0, num_encoder_layers=1, num_decoder_layers=1
    )
    model = Transformer(cfg)
    bos = 1
    src0 = tokens((64, 6), 0, low=2, high=12)
    params = nn.unbox(model.init(jax.random.key(0), src0, src0)["params"])
    opt = optax.adam(3e-3)
    opt_state = opt.init(params)

    @jax.jit
    def step(params, opt_state, key):
        src = jax.random.randint(key, (64, 6), 2, 12)
        tgt_in = jnp.concatenate([jnp.full((64, 1), bos), src[:, :-1]], 1)

        def loss_fn(p):
            logits = model.apply({"params": p}, src, tgt_in)
            return optax.softmax_cross_entropy_with_integer_labels(logits, src).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for i in range(300):
        params, opt_state, loss = step(params, opt_state, jax.random.key(i))
        losses.append(float(loss))
    assert losses[0] > 2.0  # ~ln(10) at init
    assert np.mean(losses[-20:]) < 0.1 * losses[0], (norm, losses[0], losses[-20:])


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("num_heads", 7, "divisible"),
        ("norm", "sandwich", r"norm must be one of \('post', 'pre'\)"),
        ("positional", "rotary", "positional must be one of"),
        ("attention_impl", "flash", "attention_impl must be one of"),
        ("d_model", 0, "d_model must be a positive integer"),
        ("d_ff", -5, "d_ff must be a positive integer"),
        ("dropout_rate", 1.0, r"dropout_rate must be in \[0, 1\)"),
        ("attention_dropout_rate", -0.1, "attention_dropout_rate"),
        ("num_encoder_layers", -1, "num_encoder_layers"),
        ("pad_id", 37000, "pad_id"),
        ("layer_norm_eps", 0.0, "layer_norm_eps must be a number > 0"),
        ("layer_norm_eps", "1e-5", "layer_norm_eps must be a number > 0"),
        ("final_norm", "yes", "final_norm must be True or False or None"),
        ("attention_bias", None, "attention_bias must be True or False"),
    ],
)
def test_bad_config_raises_value_error(field, value, match):
    with pytest.raises(ValueError, match=match):
        TransformerConfig(**{field: value})


def test_config_rules_across_fields():
    TransformerConfig(num_heads=7, qk_dim=64, v_dim=64)  # explicit head sizes: allowed
    with pytest.raises(ValueError, match="share_embeddings"):
        TransformerConfig(src_vocab_size=10, tgt_vocab_size=20)
    with pytest.raises(ValueError, match="fused"):
        TransformerConfig(attention_impl="fused", attention_dropout_rate=0.1)


def test_head_dims_may_differ_from_d_model_over_heads():
    """Table 3 rows (A)/(B) vary d_k and d_v independently of d_model / h."""
    cfg = TINY.replace(qk_dim=6, v_dim=10)
    src, tgt = tokens((2, 5), 0), tokens((2, 4), 1)
    params = init(cfg, src, tgt)
    attn = params["encoder"]["layer_0"]["self_attention"]
    assert attn["query"]["kernel"].shape == (32, 4, 6)
    assert attn["value"]["kernel"].shape == (32, 4, 10)
    assert applier(cfg)({"params": params}, src, tgt).shape == (2, 4, 40)


def test_fused_model_matches_reference_model():
    src, tgt = tokens((2, 6), 0), tokens((2, 5), 1)
    src = src.at[0, 4:].set(0)
    params = init(TINY, src, tgt)
    ref = applier(TINY)({"params": params}, src, tgt)
    fused = applier(TINY.replace(attention_impl="fused"))({"params": params}, src, tgt)
    np.testing.assert_allclose(fused, ref, atol=1e-4)


def test_wrong_inputs_raise_value_error():
    src, tgt = tokens((2, 6), 0), tokens((2, 5), 1)
    params = init(TINY, src, tgt)
    m = applier(TINY)
    with pytest.raises(ValueError, match="src must be integer token ids"):
        m({"params": params}, src[0], tgt)
    with pytest.raises(ValueError, match="batch sizes differ"):
        m({"params": params}, src, tgt[:1])
    with pytest.raises(ValueError, match="integer"):
        m({"params": params}, src.astype(jnp.float32), tgt)
    with pytest.raises(ValueError, match="max_len"):
        m({"params": params}, jnp.ones((1, 40), jnp.int32), tgt[:1])


def test_config_files_build_the_paper_models():
    assert RunConfig.from_config(default_config()).model == TransformerConfig()
    with pytest.raises(ValueError, match="unknown config field model.heads"):
        RunConfig.from_config({"model": {"d_model": 512, "heads": 8}})
    with pytest.raises(ValueError, match="dtype must be one of"):
        RunConfig.from_config({"model": {"dtype": "float8"}})
    assert RunConfig.from_config({"model": {"dtype": "bfloat16"}}).model.dtype == jnp.bfloat16


def test_a_smaller_target_vocabulary_is_the_first_rows_of_the_shared_one():
    """``tgt_vocab_size`` below the shared vocabulary: the same parameters, the logits over
    its first pieces alone."""
    small = TINY.replace(tgt_vocab_size=24)
    src, tgt = tokens((2, 5), 0), tokens((2, 4), 1, high=24)
    params = init(TINY, src, tgt)
    assert jax.tree.map(jnp.shape, init(small, src, tgt)) == jax.tree.map(jnp.shape, params)
    full = applier(TINY)({"params": params}, src, tgt)
    logits = applier(small)({"params": params}, src, tgt)
    assert logits.shape == (2, 4, 24)
    np.testing.assert_allclose(logits, full[..., :24], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="tgt_vocab_size <= src_vocab_size"):
        TINY.replace(tgt_vocab_size=41)
