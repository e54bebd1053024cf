"""Token embeddings and positional encodings (§3.4, §3.5)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import kernels
from transformer_jax.model.embeddings import AddPositions, Embed, sinusoidal_positions


def test_sinusoidal_hand_values():
    pe = sinusoidal_positions(3, 4)
    assert pe.shape == (3, 4) and pe.dtype == jnp.float32
    # position 0: sin 0 = 0, cos 0 = 1 for every pair
    np.testing.assert_allclose(pe[0], [0.0, 1.0, 0.0, 1.0], atol=1e-7)
    # position 1, fastest pair (i = 0): (sin 1, cos 1) ~ (0.8415, 0.5403)
    np.testing.assert_allclose(pe[1, :2], [0.84147098, 0.54030231], rtol=1e-6)
    # position 1, i = 1 with d_model 4: angle = 1 / 10000^(2/4) = 0.01
    np.testing.assert_allclose(pe[1, 2:], [np.sin(0.01), np.cos(0.01)], rtol=1e-6)
    np.testing.assert_allclose(pe[2, :2], [np.sin(2.0), np.cos(2.0)], rtol=1e-6)


def test_sinusoidal_formula_everywhere_and_bounded():
    length, d = 50, 512
    pe = np.asarray(sinusoidal_positions(length, d))
    pos = np.arange(length)[:, None]
    i = np.arange(d // 2)[None, :]
    angle = pos / 10000 ** (2 * i / d)
    np.testing.assert_allclose(pe[:, 0::2], np.sin(angle), atol=1e-6)
    np.testing.assert_allclose(pe[:, 1::2], np.cos(angle), atol=1e-6)
    assert np.abs(pe).max() <= 1.0


def test_relative_position_is_a_linear_map():
    """§3.5: PE(pos + k) is a linear function (a rotation per pair) of PE(pos)."""
    d, k = 8, 3
    pe = np.asarray(sinusoidal_positions(20, d), np.float64)
    w = 1 / 10000 ** (np.arange(0, d, 2) / d)
    for pos in (0, 5, 11):
        rotated = np.empty(d)
        s, c = pe[pos, 0::2], pe[pos, 1::2]
        rotated[0::2] = s * np.cos(k * w) + c * np.sin(k * w)
        rotated[1::2] = c * np.cos(k * w) - s * np.sin(k * w)
        np.testing.assert_allclose(rotated, pe[pos + k], atol=1e-5)


def test_odd_d_model_and_bad_sizes():
    assert sinusoidal_positions(4, 5).shape == (4, 5)
    with pytest.raises(ValueError):
        sinusoidal_positions(4, 0)


def test_embedding_scaled_by_sqrt_d_model_and_attend_is_tied():
    emb = Embed(vocab_size=11, d_model=16)
    params = nn.unbox(emb.init(jax.random.key(0), jnp.array([[1, 2]])))
    table = params["params"]["embedding"]
    out = emb.apply(params, jnp.array([[3, 4]]))
    np.testing.assert_allclose(out[0], table[jnp.array([3, 4])] * 4.0, rtol=1e-6)
    x = jnp.ones((2, 16))
    np.testing.assert_allclose(emb.apply(params, x, method=Embed.attend), x @ table.T, rtol=1e-5)
    # N(0, d_model^-0.5) init: scaled embeddings have unit variance
    big = nn.unbox(Embed(vocab_size=4000, d_model=64).init(jax.random.key(1), jnp.array([[0]])))
    assert abs(float((big["params"]["embedding"] * 8.0).std()) - 1.0) < 0.05


@pytest.mark.parametrize("kernel_set", ["xla", "cpu"])
def test_tied_logits_gradients_equal_the_plain_product(kernel_set):
    x = jax.random.normal(jax.random.key(2), (3, 5, 8))
    table = jax.random.normal(jax.random.key(3), (13, 8))
    upstream = jax.random.normal(jax.random.key(4), (3, 5, 13))

    def loss(f):
        return lambda x, e: (f(x, e) * upstream).sum()

    tied_logits = kernels.ops(kernel_set).tied_logits
    ours = jax.jit(jax.grad(loss(tied_logits), argnums=(0, 1)))(x, table)
    plain = jax.grad(loss(lambda x, e: jnp.einsum("btd,vd->btv", x, e)), argnums=(0, 1))(x, table)
    for got, want in zip(ours, plain, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_add_positions(kind):
    layer = AddPositions(max_len=10, kind=kind)
    x = jnp.zeros((2, 4, 8))
    variables = nn.unbox(layer.init(jax.random.key(0), x))
    out = layer.apply(variables, x)
    table = (
        sinusoidal_positions(10, 8) if kind == "sinusoidal" else variables["params"]["positions"]
    )
    np.testing.assert_allclose(out[0], table[:4], rtol=1e-6)
    # explicit per-segment positions (packing) index the same table
    pos = jnp.array([[0, 1, 0, 1], [0, 1, 2, 3]])
    np.testing.assert_allclose(layer.apply(variables, x, pos)[0, 2], table[0], rtol=1e-6)
    assert ("params" in variables) == (kind == "learned")
    with pytest.raises(ValueError, match="max_len"):
        layer.apply(variables, jnp.zeros((1, 11, 8)))


def test_add_positions_decode_advances_one_step_per_call():
    layer = AddPositions(max_len=10, decode=True)
    cache = nn.unbox(layer.init(jax.random.key(0), jnp.zeros((1, 10, 8)))["cache"])
    table = sinusoidal_positions(10, 8)
    for t in range(3):
        out, state = layer.apply({"cache": cache}, jnp.zeros((1, 1, 8)), mutable=["cache"])
        cache = state["cache"]
        np.testing.assert_allclose(out[0, 0], table[t], rtol=1e-6)
