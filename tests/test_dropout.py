"""Dropout from 16-bit random numbers (§5.4): rate, scaling, determinism, masks differ."""

import flax.errors
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.dropout import Dropout, dropout, keep_mask


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5])
def test_keep_fraction_and_expectation(rate):
    x = jnp.ones((512, 513))  # odd size: the last 32-bit word is half used
    y = dropout(x, rate, jax.random.PRNGKey(0))
    kept = np.asarray(y != 0)
    n = kept.size
    # within 5 standard deviations of the binomial mean
    assert abs(kept.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n)
    np.testing.assert_allclose(np.asarray(y)[kept], 1 / (1 - rate), rtol=2e-5)
    assert abs(float(y.mean()) - 1.0) < 5 * np.sqrt(rate / (1 - rate) / n)


def test_keep_probability_is_exact_to_16_bits_and_masks_are_independent():
    mask, keep = keep_mask(jax.random.PRNGKey(1), 0.1, (4, 1000))
    assert keep == round(0.9 * 65536) / 65536 and abs(keep - 0.9) < 2**-17
    m = np.asarray(mask, np.float64)
    # the two halves of each 32-bit word decide neighbouring elements: uncorrelated
    even, odd = m.reshape(-1)[0::2], m.reshape(-1)[1::2]
    assert abs(np.corrcoef(even, odd)[0, 1]) < 0.05
    other, _ = keep_mask(jax.random.PRNGKey(2), 0.1, (4, 1000))
    assert (np.asarray(other) != np.asarray(mask)).any()


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
