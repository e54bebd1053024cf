"""One layer by hand (§3.1, §3.3, Eq. 1, Eq. 2) and dropout at each of the paper's sites (§5.4).

Float32 numerics against numpy in float64; parameters drawn at random (LayerNorm scales and
biases and the FFN biases included) so that every one of them is pinned.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_CONFIG

from transformer_jax import MultiHeadAttention, Transformer
from transformer_jax.model.attention import padding_mask
from transformer_jax.model.layers import EncoderLayer, FeedForward

EPS = 1e-6  # LayerNorm epsilon


def random_like(params, seed=0, scale=0.3):
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(
        tree,
        [scale * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)],
    )


def layer_norm(x, p):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * p["scale"] + p["bias"]


def ffn(x, p):
    """Eq. 2: FFN(x) = max(0, x W1 + b1) W2 + b2."""
    hidden = np.maximum(0.0, x @ p["w1"]["kernel"] + p["w1"]["bias"])
    return hidden @ p["w2"]["kernel"] + p["w2"]["bias"]


def self_attention(x, p, keep):
    """MultiHead(x, x, x) = Concat(head_1..head_h) W^O, head_i = softmax(QK^T/sqrt(d_k)) V."""
    q = np.einsum("btd,dhk->bhtk", x, p["query"]["kernel"])
    k = np.einsum("btd,dhk->bhtk", x, p["key"]["kernel"])
    v = np.einsum("btd,dhk->bhtk", x, p["value"]["kernel"])
    scores = np.where(keep, q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1]), -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    heads = (weights / weights.sum(-1, keepdims=True)) @ v  # [b, h, t, d_v]
    return np.einsum("bhtk,hkd->btd", heads, p["out"]["kernel"])


def as_numpy(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def test_feed_forward_is_equation_2(tiny_config):
    x = jax.random.normal(jax.random.key(1), (2, 5, tiny_config.d_model))
    module = FeedForward(tiny_config)
    params = nn.unbox(random_like(module.init(jax.random.key(0), x)["params"]))
    got = jax.jit(module.apply)({"params": params}, x)
    np.testing.assert_allclose(got, ffn(np.asarray(x, np.float64), as_numpy(params)), atol=1e-5)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_encoder_layer_by_hand(tiny_config, norm):
    """post (paper): LayerNorm(x + Sublayer(x)) twice; pre: x + Sublayer(LayerNorm(x))."""
    cfg = tiny_config.replace(norm=norm)
    x = jax.random.normal(jax.random.key(1), (2, 5, cfg.d_model))
    tokens = jnp.array([[5, 6, 7, 8, 3], [5, 6, 3, 0, 0]])
    mask = padding_mask(tokens)
    layer = EncoderLayer(cfg)
    params = nn.unbox(random_like(layer.init(jax.random.key(0), x, mask)["params"], seed=2))
    got = jax.jit(layer.apply)({"params": params}, x, mask)

    p, h, keep = as_numpy(params), np.asarray(x, np.float64), np.asarray(mask)
    attn_norm, ffn_norm = p["attention_block"]["norm"], p["ffn_block"]["norm"]
    if norm == "post":
        h = layer_norm(h + self_attention(h, p["self_attention"], keep), attn_norm)
        h = layer_norm(h + ffn(h, p["ffn"]), ffn_norm)
    else:
        h = h + self_attention(layer_norm(h, attn_norm), p["self_attention"], keep)
        h = h + ffn(layer_norm(h, ffn_norm), p["ffn"])
    np.testing.assert_allclose(got, h, atol=2e-5)


# Dropout at the paper's sites (§5.4): "We apply dropout to the output of each sub-layer,
# before it is added to the sub-layer input and normalized. In addition, we apply dropout
# to the sums of the embeddings and the positional encodings in both the encoder and
# decoder stacks."


@pytest.fixture(scope="module")
def training_pass(tiny_batch):
    """Every call of the modules that matter in one training pass:
    (class name, path, args, output, module, kwargs)."""
    cfg = TINY_CONFIG.replace(dropout_rate=0.3, attention_dropout_rate=0.2)
    src, tgt = tiny_batch["src"], tiny_batch["tgt_in"]
    model = Transformer(cfg)
    params = nn.unbox(model.init(jax.random.key(0), src, tgt)["params"])
    names = {"Dropout", "SubLayer", "AddPositions", "MultiHeadAttention", "FeedForward"}
    names |= {"EncoderLayer", "DecoderLayer"}
    calls = []

    def record(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if context.method_name == "__call__" and type(context.module).__name__ in names:
            name = type(context.module).__name__
            calls.append((name, context.module.path, args, out, context.module, kwargs))
        return out

    with nn.intercept_methods(record):
        model.apply(
            {"params": params}, src, tgt, deterministic=False, rngs={"dropout": jax.random.key(1)}
        )
    return cfg, calls


def _calls(calls, kind):
    return [(path, args, out) for name, path, args, out, *_ in calls if name == kind]


def test_every_dropout_drops_at_its_rate(training_pass):
    cfg, calls = training_pass
    dropouts = _calls(calls, "Dropout")
    assert len(dropouts) == 2 + 2 * cfg.num_encoder_layers + 3 * cfg.num_decoder_layers
    for path, (x, *_), out in dropouts:
        x, out = np.asarray(x), np.asarray(out)
        kept = out != 0
        assert 0.1 < 1 - kept.mean() < 0.5, path  # rate 0.3
        np.testing.assert_allclose(out[kept], x[kept] / (1 - cfg.dropout_rate), rtol=1e-6)


def test_dropout_on_the_sums_of_embeddings_and_positions_in_both_stacks(training_pass):
    _, calls = training_pass
    for stack, layer in (("encoder", "EncoderLayer"), ("decoder", "DecoderLayer")):
        (summed,) = [out for path, _, out in _calls(calls, "AddPositions") if path[0] == stack]
        (dropout,) = [
            (args[0], out) for path, args, out in _calls(calls, "Dropout") if path[:-1] == (stack,)
        ]
        first = [args[0] for path, args, _ in _calls(calls, layer) if path == (stack, "layer_0")]
        np.testing.assert_array_equal(dropout[0], summed)  # dropout of the sum
        np.testing.assert_array_equal(first[0], dropout[1])  # what the first layer receives


def test_residual_dropout_on_each_sublayer_output_before_add_and_norm(training_pass):
    cfg, calls = training_pass
    sublayers = _calls(calls, "SubLayer")
    assert len(sublayers) == 2 * cfg.num_encoder_layers + 3 * cfg.num_decoder_layers
    outputs = _calls(calls, "MultiHeadAttention") + _calls(calls, "FeedForward")
    for path, (x, *_), out in sublayers:
        (dropped,) = [(a[0], o) for p, a, o in _calls(calls, "Dropout") if p[:-1] == path]
        # the dropout's input is the output of one of this layer's sub-layers ...
        assert any(p[:-1] == path[:-1] and np.array_equal(o, dropped[0]) for p, _, o in outputs), (
            path
        )
        # ... and its output is added to the sub-layer input, then normalized (LayerNorm
        # at initialisation: scale 1, bias 0)
        z = np.asarray(x, np.float64) + np.asarray(dropped[1], np.float64)
        np.testing.assert_allclose(out, layer_norm(z, {"scale": 1.0, "bias": 0.0}), atol=1e-5)


def test_attention_dropout_when_the_config_has_it(training_pass):
    """Not in the paper's base model (attention_dropout_rate=0): a switch, off by default,
    that every attention layer applies to its weights while training."""
    assert TINY_CONFIG.attention_dropout_rate == 0.0
    cfg, calls = training_pass
    attentions = [c for c in calls if c[0] == "MultiHeadAttention"]
    assert len(attentions) == cfg.num_encoder_layers + 2 * cfg.num_decoder_layers
    assert all(c[4].dropout_rate == cfg.attention_dropout_rate for c in attentions)
    assert all(c[5]["deterministic"] is False for c in attentions)

    x = jax.random.normal(jax.random.key(0), (2, 5, 16))
    attention = MultiHeadAttention(num_heads=2, qk_dim=8, v_dim=8, dropout_rate=0.3)
    variables = nn.unbox(attention.init(jax.random.key(1), x))
    train = lambda seed: attention.apply(  # noqa: E731
        variables, x, deterministic=False, rngs={"dropout": jax.random.key(seed)}
    )
    evaluated = attention.apply(variables, x)
    assert not np.allclose(train(1), evaluated) and not np.allclose(train(1), train(2))
    without = MultiHeadAttention(num_heads=2, qk_dim=8, v_dim=8)
    np.testing.assert_array_equal(
        without.apply(variables, x, deterministic=False, rngs={"dropout": jax.random.key(1)}),
        evaluated,
    )


def test_word_dropout_zeroes_whole_token_embeddings_when_the_config_has_it():
    """Not in the paper (word_dropout_rate=0): each input token's embedding in both stacks is
    zeroed whole with probability ``rate`` or scaled by ``1 / (1 - rate)``, before positions
    are added; evaluation and the parameters are those of the model without it."""
    assert TINY_CONFIG.word_dropout_rate == 0.0
    cfg = TINY_CONFIG.replace(dropout_rate=0.0, word_dropout_rate=0.5)
    tokens = jax.random.randint(jax.random.key(2), (8, 12), 3, cfg.vocab_size)
    model, plain = Transformer(cfg), Transformer(TINY_CONFIG.replace(dropout_rate=0.0))
    params = nn.unbox(model.init(jax.random.key(0), tokens, tokens)["params"])
    plain_params = nn.unbox(plain.init(jax.random.key(0), tokens, tokens)["params"])
    assert jax.tree.structure(params) == jax.tree.structure(plain_params)
    calls = []

    def record(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if type(context.module).__name__ in ("Dropout", "AddPositions"):
            calls.append((type(context.module).__name__, context.module.path, args, out))
        return out

    rngs = {"dropout": jax.random.key(1)}
    with nn.intercept_methods(record):
        model.apply({"params": params}, tokens, tokens, deterministic=False, rngs=rngs)
    for stack in ("encoder", "decoder"):
        [((x, *_), out)] = [(a, o) for n, p, a, o in calls if p == (stack, "word_dropout")]
        x, out = np.asarray(x), np.asarray(out)
        dropped = (out == 0).all(-1)
        assert 0.3 < dropped.mean() < 0.7, stack
        np.testing.assert_allclose(out[~dropped], 2.0 * x[~dropped], rtol=1e-6)
        (positions_input,) = [a[0] for n, p, a, o in calls if p == (stack, "positions")]
        np.testing.assert_array_equal(positions_input, out)  # dropped before positions
    np.testing.assert_array_equal(
        model.apply({"params": params}, tokens, tokens),
        plain.apply({"params": params}, tokens, tokens),
    )
    with pytest.raises(ValueError, match="word_dropout_rate"):
        TINY_CONFIG.replace(word_dropout_rate=1.0)
