"""``remat``: each layer recomputed in the backward pass ('full' or a checkpoint policy), with
the gradients of the model without it (dropout on, unrolled and scanned layers, a variant)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_CONFIG

import transformer_jax as tj
from transformer_jax.model import variants

SRC = jnp.array([[4, 5, 6, 3, 0], [7, 3, 0, 0, 0]], jnp.int32)
TGT = jnp.array([[2, 7, 8, 9, 3], [2, 4, 3, 0, 0]], jnp.int32)


def gradient(model, params):
    """The gradient of the summed logits (dropout on) and the forward program's text."""

    def loss(p):
        rngs = {"dropout": jax.random.key(1)}
        return model.apply({"params": p}, SRC, TGT, deterministic=False, rngs=rngs).sum()

    return jax.jit(jax.grad(loss))(params), str(jax.make_jaxpr(loss)(params))


@pytest.mark.parametrize(
    "scan, remat",
    [(False, "full"), pytest.param(True, "dots_saveable", marks=pytest.mark.slow)],
)
def test_remat_keeps_the_gradients(scan, remat):
    config = TINY_CONFIG.replace(num_encoder_layers=1, num_decoder_layers=1, scan_layers=scan)
    model = tj.Transformer(config, score_fn=variants.rope)
    params = nn.unbox(model.init(jax.random.key(0), SRC, TGT)["params"])
    reference, program = gradient(model, params)
    assert "remat" not in program
    grads, program = gradient(model.clone(config=model.config.replace(remat=remat)), params)
    assert "remat" in program  # the layers are rematerialised
    for want, got in zip(jax.tree.leaves(reference), jax.tree.leaves(grads), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4 * float(np.abs(want).max()) + 1e-6)


def test_remat_names_its_choices():
    with pytest.raises(ValueError, match="remat must be one of"):
        TINY_CONFIG.replace(remat="everything")
