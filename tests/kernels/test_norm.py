"""The ``xla`` set's LayerNorm (``kernels.norm``), whose gradient works from its output: the
same values and gradients as flax's ``nn.LayerNorm``, finite gradients at gamma = 0, and the
model on that set the same as with ``nn.LayerNorm`` (same parameters, loss and gradients)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_CONFIG

from transformer_jax import Transformer, kernels
from transformer_jax.kernels import norm, precision
from transformer_jax.model import layers
from transformer_jax.training.loss import loss_and_metrics

EPS = 1e-6
SRC = jnp.array([[4, 5, 6, 7, 3], [8, 9, 3, 0, 0]], jnp.int32)
TGT = jnp.array([[2, 4, 5, 6, 7, 9], [2, 8, 9, 3, 0, 0]], jnp.int32)


def inputs(dtype, shape=(3, 7, 64)):
    """Vectors off zero mean and unit scale, gamma and beta away from 1 and 0, a cotangent."""
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    x = (3.0 * jax.random.normal(k[0], shape) + 1.5).astype(dtype)
    scale = 1.0 + 0.5 * jax.random.uniform(k[1], shape[-1:], minval=-1.0)
    bias = 0.3 * jax.random.normal(k[2], shape[-1:])
    return x, scale, bias, jax.random.normal(k[3], shape)


def flax_layer_norm(x, scale, bias, dtype):
    module = nn.LayerNorm(epsilon=EPS, dtype=dtype)
    return module.apply({"params": {"scale": scale, "bias": bias}}, x)


def value_and_grads(layer_norm, x, scale, bias, cotangent, dtype):
    def loss(x, scale, bias):
        y = layer_norm(x, scale, bias, dtype)
        return (y.astype(jnp.float32) * cotangent).sum(), y

    (_, y), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(x, scale, bias)
    return y, grads


def ours(x, scale, bias, dtype):
    return norm.layer_norm(x, scale, bias, EPS, dtype)


def close(a, b, tol):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max())


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_same_values_and_gradients_as_flax(dtype, tol):
    """Float32: equal values, gradients (input, gamma, beta) to float32 rounding. Bfloat16 in
    and out: values equal, gradients within bfloat16's rounding of the output they start from."""
    args = inputs(dtype)
    (y, grads), (y_ref, grads_ref) = (
        value_and_grads(f, *args, dtype) for f in (ours, flax_layer_norm)
    )
    assert y.dtype == y_ref.dtype == dtype
    np.testing.assert_allclose(
        np.asarray(y, np.float32), np.asarray(y_ref, np.float32), rtol=1e-6, atol=1e-6
    )
    assert [g.dtype for g in grads] == [dtype, jnp.float32, jnp.float32]
    for g, g_ref in zip(grads, grads_ref, strict=True):
        close(g, g_ref, tol)


def test_the_gradient_keeps_the_output_not_the_input():
    """What the backward pass saves: the output, gamma, beta and one 1/sigma per vector;
    flax's keeps a vector-sized array derived from the input as well."""
    x, scale, bias, _ = inputs(jnp.bfloat16)

    def saved(layer_norm):
        _, vjp = jax.vjp(lambda *a: layer_norm(*a, jnp.bfloat16), x, scale, bias)
        return [a for a in jax.tree.leaves(vjp) if isinstance(a, jax.Array)]

    big = [a for a in saved(ours) if a.size == x.size]
    y = ours(x, scale, bias, jnp.bfloat16)
    assert len(big) == 1 and np.array_equal(big[0], y), [a.shape for a in big]
    assert sum(a.size for a in saved(ours)) == x.size + 2 * x.shape[-1] + x.size // x.shape[-1]
    assert sum(a.size == x.size for a in saved(flax_layer_norm)) >= 1


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gamma_at_zero_gives_finite_gradients(dtype):
    x, scale, bias, cotangent = inputs(dtype)
    scale = scale.at[:4].set(jnp.array([0.0, -0.0, 1e-9, -1e-12]))
    (y, grads), (_, grads_ref) = (
        value_and_grads(f, x, scale, bias, cotangent, dtype) for f in (ours, flax_layer_norm)
    )
    assert bool(jnp.isfinite(y.astype(jnp.float32)).all())
    for g in grads:
        assert bool(jnp.isfinite(g.astype(jnp.float32)).all())
    np.testing.assert_allclose(grads[2], grads_ref[2], rtol=1e-5)  # beta's: from dy only


@pytest.fixture
def bfloat16_products_on_cpu(monkeypatch):
    """The ``xla`` set's bfloat16 products as float32 products of the same bfloat16 values:
    XLA:CPU rejects some bfloat16 products with float32 results."""

    def exact(spec, a, b):
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
        return jnp.einsum(spec, a, b, precision=jax.lax.Precision.HIGHEST)

    monkeypatch.setattr(precision, "bfloat16_product", exact)


def flax_norm(config, name=None):
    """The sub-layers' LayerNorm as flax's ``nn.LayerNorm`` (the ``cpu`` set's)."""
    return layers.layer_norm(config.replace(kernels="cpu"), name=name)


@pytest.mark.parametrize(
    "changes,tol",
    [({}, 1e-5), ({"dtype": jnp.bfloat16}, 5e-2)],
    ids=["float32", "bfloat16"],
)
def test_the_xla_set_model_matches_flax_layer_norm(changes, tol, bfloat16_products_on_cpu):
    """The model on the ``xla`` set (its LayerNorm from ``kernels.norm``) and the same model
    with ``nn.LayerNorm``: the same parameter tree, logits and gradient of the loss (in
    bfloat16 to 5% of each gradient's largest entry, where either model's differs from the
    float32 model's by up to 38%)."""
    config = TINY_CONFIG.replace(kernels="xla", dropout_rate=0.1, **changes)
    assert kernels.ops(config.kernel_set).layer_norm is norm.layer_norm
    model, reference = Transformer(config), Transformer(config, norm=flax_norm)
    params = model.init(jax.random.PRNGKey(0), SRC, TGT[:, :-1])["params"]
    reference_params = reference.init(jax.random.PRNGKey(0), SRC, TGT[:, :-1])["params"]
    assert jax.tree.structure(params) == jax.tree.structure(reference_params)
    jax.tree.map(np.testing.assert_array_equal, params, reference_params)
    # scale and bias away from 1 and 0, so that the gradient's recovery of xhat is exercised
    params = jax.tree_util.tree_map_with_path(
        lambda path, p: p * 1.3 + 0.2 if "norm" in jax.tree_util.keystr(path) else p, params
    )

    def logits_and_grads(module):
        rngs = {"dropout": jax.random.PRNGKey(7)}

        def loss(p):
            logits = module.apply({"params": p}, SRC, TGT[:, :-1], deterministic=False, rngs=rngs)
            return loss_and_metrics(logits, TGT[:, 1:], 0, 0.1)[0], logits

        (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        return logits, grads

    (logits, grads), (logits_ref, grads_ref) = map(logits_and_grads, (model, reference))
    forward = jax.make_jaxpr(lambda p: model.apply({"params": p}, SRC, TGT[:, :-1]))(params)
    assert "custom_vjp_call" in str(forward)
    close(logits, logits_ref, tol)
    jax.tree.map(lambda a, b: close(a, b, tol), grads, grads_ref)
