"""Dropout (§5.4): the fused threefry bits equal JAX's, rate, scaling, determinism, masks differ;
the backward pass keeps the mask as bits and gives the plain formula's gradients."""

import flax.errors
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_CONFIG

from transformer_jax import Transformer
from transformer_jax.kernels import dropout as dropout_module
from transformer_jax.kernels.dropout import (
    dropout,
    fused_dropout,
    keep_mask,
    pack_mask,
    random_bits,
    threefry2x32,
    unpack_mask,
)
from transformer_jax.model.layers import Dropout


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5])
@pytest.mark.parametrize("drop", [dropout, fused_dropout])
def test_keep_fraction_and_expectation(rate, drop):
    x = jnp.ones((512, 513))
    y = drop(x, rate, jax.random.PRNGKey(0))
    kept = np.asarray(y != 0)
    n = kept.size
    # within 5 standard deviations of the binomial mean
    assert abs(kept.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n)
    np.testing.assert_allclose(np.asarray(y)[kept], 1 / (1 - rate), rtol=2e-5)
    assert abs(float(y.mean()) - 1.0) < 5 * np.sqrt(rate / (1 - rate) / n)


def test_threefry_known_answers():
    """Threefry-2x32, 20 rounds: the known-answer vectors of Random123 (Salmon et al. 2011)."""
    cases = [
        ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
        ((2**32 - 1,) * 2, (2**32 - 1,) * 2, (0x1CB996FC, 0xBB002BE7)),
        ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
    ]
    for key, counter, expected in cases:
        words = threefry2x32(tuple(map(jnp.uint32, key)), tuple(map(jnp.uint32, counter)))
        assert tuple(int(w) for w in words) == expected


@pytest.mark.parametrize("make_key", [jax.random.PRNGKey, jax.random.key])
@pytest.mark.parametrize("shape", [(5,), (3, 7), (2, 3, 65)])
def test_random_bits_are_jax_random_bits(make_key, shape):
    key = make_key(7)
    expected = jax.random.bits(key, shape, jnp.uint32)
    np.testing.assert_array_equal(jax.jit(random_bits, static_argnums=1)(key, shape), expected)


def test_random_bits_of_other_keys_and_layouts_come_from_jax():
    def same(key):
        expected = jax.random.bits(key, (3, 7), jnp.uint32)
        np.testing.assert_array_equal(random_bits(key, (3, 7)), expected)

    same(jax.random.key(7, impl="rbg"))
    with jax.threefry_partitionable(False):
        same(jax.random.PRNGKey(7))


def test_keep_probability_is_exact_to_32_bits_and_masks_are_independent():
    mask, keep = keep_mask(jax.random.PRNGKey(1), 0.1, (40, 1000))
    assert keep == round(0.9 * 2**32) / 2**32 and abs(keep - 0.9) < 2**-33
    m = np.asarray(mask, np.float64).reshape(-1)
    assert abs(np.corrcoef(m[0::2], m[1::2])[0, 1]) < 0.05  # neighbours; 7 standard deviations
    other, _ = keep_mask(jax.random.PRNGKey(2), 0.1, (40, 1000))
    assert (np.asarray(other) != np.asarray(mask)).any()
    assert keep_mask(jax.random.PRNGKey(1), 1e-12, (8,))[1] == (2**32 - 1) / 2**32  # < 1


def test_both_kernel_sets_drop_the_same_elements():
    x = jax.random.normal(jax.random.PRNGKey(5), (3, 7, 33))
    key = jax.random.PRNGKey(6)
    np.testing.assert_array_equal(
        jax.jit(fused_dropout, static_argnums=1)(x, 0.1, key), dropout(x, 0.1, key)
    )
    y = Dropout(0.3).apply({}, x, deterministic=False, rngs={"dropout": key})
    z = Dropout(0.3, "cpu").apply({}, x, deterministic=False, rngs={"dropout": key})
    np.testing.assert_array_equal(y, z)


def test_module_is_identity_when_deterministic_and_zero_rate():
    x = jnp.arange(12.0).reshape(3, 4)
    layer = Dropout(0.5)
    assert (layer.apply({}, x, deterministic=True) == x).all()
    assert (Dropout(0.0).apply({}, x, deterministic=False) == x).all()
    y = layer.apply({}, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(3)})
    assert ((y == 0) | (y == 2 * x)).all() and (y == 0).any()
    with pytest.raises(flax.errors.InvalidRngError):
        layer.apply({}, x, deterministic=False)
    assert (dropout(x, 1.0, jax.random.PRNGKey(0)) == 0).all()


@pytest.mark.parametrize("shape", [(), (1,), (5,), (3, 8), (2, 3, 13), (4, 1)])
def test_packed_masks_unpack_to_the_mask(shape):
    mask = jax.random.bernoulli(jax.random.PRNGKey(len(shape)), 0.5, shape)
    packed = pack_mask(mask)
    assert packed.dtype == jnp.uint8 and packed.shape[:-1] == mask.shape[:-1]
    assert packed.shape[-1] == -(-(mask.shape[-1] if shape else 1) // 8)
    np.testing.assert_array_equal(unpack_mask(packed, shape), mask)


@pytest.mark.parametrize("drop", [dropout, fused_dropout])
def test_backward_pass_keeps_one_bit_per_element(drop):
    """The residuals between the passes: the mask packed, not booleans or 32-bit words."""
    x = jax.random.normal(jax.random.PRNGKey(0), (6, 64))
    _, backward = jax.vjp(lambda x: drop(x, 0.1, jax.random.PRNGKey(1)), x)
    kept = sum(leaf.nbytes for leaf in jax.tree.leaves(backward))
    assert kept <= x.size // 8 + 64


def paper_dropout(rate, bits, x, rng):
    """Dropout as the plain formula, differentiated by JAX (its residual: the boolean mask)."""
    mask, keep = keep_mask(rng, rate, x.shape, bits)
    return jnp.where(mask, x / jnp.asarray(keep, x.dtype), jnp.zeros((), x.dtype))


@pytest.mark.parametrize("kernels,dtype", [("xla", jnp.float32), ("cpu", jnp.bfloat16)])
def test_model_loss_and_gradients_equal_the_plain_formulas(kernels, dtype, monkeypatch):
    cfg = TINY_CONFIG.replace(kernels=kernels, dtype=dtype, dropout_rate=0.3)
    cfg = cfg.replace(word_dropout_rate=0.1, num_encoder_layers=1, num_decoder_layers=1)
    src = jax.random.randint(jax.random.PRNGKey(0), (3, 7), 4, 16)
    tgt = jax.random.randint(jax.random.PRNGKey(1), (3, 6), 4, 16)
    model = Transformer(cfg)
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(2), src, tgt)["params"])

    def loss_and_grads(params):
        def loss(p):
            rngs = {"dropout": jax.random.PRNGKey(3)}
            logits = model.apply({"params": p}, src, tgt, deterministic=False, rngs=rngs)
            return jnp.sum(jnp.sin(logits))

        return jax.value_and_grad(loss)(params)

    ours = jax.jit(loss_and_grads)(params)
    monkeypatch.setattr(dropout_module, "_dropout", paper_dropout)
    plain = jax.jit(loss_and_grads)(params)
    np.testing.assert_array_equal(ours[0], plain[0])
    jax.tree.map(np.testing.assert_array_equal, ours[1], plain[1])
