"""``scan_layers=True``: the same model as the unrolled layers, with parameters stacked.

Every test converts unrolled parameters (``layer_0`` ... ``layer_{N-1}``) to the scanned
layout (``layers``, a leading layer axis) and checks that the scanned model computes the
same function: logits, gradients, cached greedy and beam decoding, attention maps.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_CONFIG

from transformer_jax import Transformer
from transformer_jax.analysis.introspection import attention_maps
from transformer_jax.inference.decoding import beam_search, greedy_search
from transformer_jax.training.loss import loss_and_metrics

CFG = TINY_CONFIG.replace(vocab_size=12, num_decoder_layers=3, max_len=16)
SCANNED = CFG.replace(scan_layers=True)
SRC = jnp.array([[4, 5, 6, 7, 3], [8, 9, 3, 0, 0]], jnp.int32)
TGT = jnp.array([[2, 4, 5, 6, 7, 9], [2, 8, 9, 3, 0, 0]], jnp.int32)


def stacked(params):
    """Unrolled parameters in the scanned layout."""
    out = {}
    for name, sub in params.items():
        layers = sorted((k for k in sub if k.startswith("layer_")), key=lambda k: int(k[6:]))
        if not layers:
            out[name] = sub
            continue
        rest = {k: v for k, v in sub.items() if k not in layers}
        out[name] = dict(
            rest, layers=jax.tree.map(lambda *xs: jnp.stack(xs), *(sub[k] for k in layers))
        )
    return out


@pytest.fixture(scope="module")
def params():
    return nn.unbox(jax.jit(Transformer(CFG).init)(jax.random.key(0), SRC, TGT)["params"])


def test_parameters_are_stacked_per_stack(params):
    scanned = nn.unbox(jax.jit(Transformer(SCANNED).init)(jax.random.key(0), SRC, TGT)["params"])
    shapes = lambda tree: jax.tree.map(jnp.shape, tree)  # noqa: E731
    assert shapes(scanned) == shapes(stacked(params))
    kernel = scanned["decoder"]["layers"]["ffn"]["w1"]["kernel"]
    assert kernel.shape == (3, 16, 32)
    assert not np.allclose(kernel[0], kernel[1])  # each layer initialised on its own


def test_logits_and_gradients_equal_the_unrolled_model(params):
    def loss(cfg, p):
        logits = Transformer(cfg).apply({"params": p}, SRC, TGT)
        return loss_and_metrics(logits, jnp.roll(TGT, -1, axis=1), 0, 0.1)[0]

    unrolled = jax.jit(jax.value_and_grad(lambda p: loss(CFG, p)))
    scanned = jax.jit(jax.value_and_grad(lambda p: loss(SCANNED, p)))
    value, grads = unrolled(params)
    value_scanned, grads_scanned = scanned(stacked(params))
    np.testing.assert_allclose(value_scanned, value, rtol=1e-6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        grads_scanned,
        stacked(grads),
    )


def test_training_dropout_differs_between_layers(params):
    """split_rngs: each scanned layer draws its own dropout mask (as unrolled layers do).

    The outputs of every dropout in the scanned stacks are captured (stacked on the layer
    axis); where a sub-layer's output was dropped they are exactly 0, so their zeros are
    the masks, which must differ from layer to layer."""
    is_dropout = lambda module, method: type(module).__name__ == "Dropout"  # noqa: E731
    apply = jax.jit(
        lambda p, r: Transformer(SCANNED).apply(
            {"params": p},
            SRC,
            TGT,
            deterministic=False,
            rngs={"dropout": r},
            capture_intermediates=is_dropout,
            mutable=["intermediates"],
        )
    )
    logits, state = apply(stacked(params), jax.random.key(1))
    assert np.isfinite(logits).all()
    sites = 0
    for stack, count in (("encoder", CFG.num_encoder_layers), ("decoder", CFG.num_decoder_layers)):
        blocks = state["intermediates"][stack]["layers"]
        for block in (b for name, b in blocks.items() if name != "hidden_state"):
            (out,) = jax.tree.leaves(block)  # [layers, batch, length, d_model]
            masks = np.asarray(out) == 0
            assert masks.shape[0] == count and 0 < masks.mean() < 0.5
            assert all(not np.array_equal(masks[0], m) for m in masks[1:]), stack
            sites += 1
    assert sites == 2 + 3  # the encoder's two sub-layers, the decoder's three


def test_cached_decoding_equals_the_unrolled_model(params):
    p = stacked(params)
    np.testing.assert_array_equal(
        greedy_search(SCANNED, p, SRC, max_len=8), greedy_search(CFG, params, SRC, max_len=8)
    )
    tokens, scores = beam_search(SCANNED, p, SRC, beam_size=3, max_len=8, return_all=True)
    tokens_ref, scores_ref = beam_search(CFG, params, SRC, beam_size=3, max_len=8, return_all=True)
    np.testing.assert_array_equal(tokens, tokens_ref)
    np.testing.assert_allclose(scores, scores_ref, rtol=1e-5)


def test_ensemble_of_a_scanned_and_an_unrolled_model(params):
    """Each member's cache is reordered along its own batch axis ([layers, rows, ...] when
    scanned): the ensemble equals the one of the two unrolled models."""
    other = nn.unbox(jax.jit(Transformer(CFG).init)(jax.random.key(1), SRC, TGT)["params"])
    mixed = beam_search([SCANNED, CFG], [stacked(params), other], SRC, beam_size=3, max_len=8)
    unrolled = beam_search(CFG, [params, other], SRC, beam_size=3, max_len=8)
    np.testing.assert_array_equal(mixed, unrolled)
    assert not np.array_equal(unrolled, beam_search(CFG, params, SRC, beam_size=3, max_len=8))


def test_attention_maps_equal_the_unrolled_model(params):
    maps = attention_maps(SCANNED, stacked(params), SRC, TGT)
    ref = attention_maps(CFG, params, SRC, TGT)
    assert [len(maps[k]) for k in ("encoder", "decoder_self", "cross")] == [2, 3, 3]
    for key in ref:
        for got, want in zip(maps[key], ref[key], strict=True):
            np.testing.assert_allclose(got, want, atol=1e-6)
