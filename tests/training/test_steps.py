"""The train step as a user calls it: the batch format of make_batch, the dropout key taken
from the state (donation-safe, reproducible), accumulation, a decoder-only model."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_CONFIG

from transformer_jax import Transformer
from transformer_jax.ids import BOS_ID, EOS_ID
from transformer_jax.model.transformer import Decoder
from transformer_jax.training import schema
from transformer_jax.training.optimizer import transformer_optimizer, transformer_schedule
from transformer_jax.training.schema import RunConfig
from transformer_jax.training.steps import (
    accumulate_gradients,
    apply_gradients,
    compute_gradients,
    create_train_state,
    dropout_key,
    eval_step,
    make_batch,
    train_step,
    zero_accumulator,
)
from transformer_jax.training.validation import validate_config

CFG = TINY_CONFIG.replace(
    vocab_size=20, num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.3, max_len=16
)
SRC = [[5, 6, 7], [8]]
TGT = [[9, 10], [11, 12, 13, 14]]


def test_make_batch_shifts_and_pads():
    b = make_batch(SRC, TGT)
    np.testing.assert_array_equal(b["src"], [[5, 6, 7, EOS_ID], [8, EOS_ID, 0, 0]])
    np.testing.assert_array_equal(b["tgt_in"], [[BOS_ID, 9, 10, 0, 0], [BOS_ID, 11, 12, 13, 14]])
    np.testing.assert_array_equal(b["tgt_out"], [[9, 10, EOS_ID, 0, 0], [11, 12, 13, 14, EOS_ID]])
    assert all(v.dtype == np.int32 for v in b.values())
    fixed = make_batch(SRC, TGT, length=8)
    assert {k: v.shape for k, v in fixed.items()} == dict.fromkeys(b, (2, 8))
    lm = make_batch(None, [[5, 6, 7]], eos_id=None)  # a window of running text
    assert set(lm) == {"tgt_in", "tgt_out"}
    np.testing.assert_array_equal(lm["tgt_in"], [[BOS_ID, 5, 6]])
    np.testing.assert_array_equal(lm["tgt_out"], [[5, 6, 7]])
    with pytest.raises(ValueError, match="length=3"):
        make_batch(SRC, TGT, length=3)
    with pytest.raises(ValueError, match="rows"):
        make_batch(SRC[:1], TGT)


@pytest.fixture(scope="module")
def setup():
    batch = make_batch(SRC, TGT, length=6)
    model = Transformer(CFG)
    params = nn.unbox(
        jax.jit(model.init)(jax.random.key(0), batch["src"], batch["tgt_in"])["params"]
    )
    tx = transformer_optimizer(transformer_schedule(CFG.d_model, 10))
    return model, batch, create_train_state(params, tx, jax.random.PRNGKey(7))


def test_donated_steps_use_the_states_key(setup):
    """Three donated steps in a row run (no 'Buffer has been deleted or donated') and equal
    the same steps computed by hand with fold_in(state.rng, step)."""
    model, batch, state = setup
    step = jax.jit(functools.partial(train_step, model=model), donate_argnums=0)
    expected = state
    for s in range(1, 4):
        grads, sums = compute_gradients(
            model, expected.params, batch, jax.random.fold_in(expected.rng, s)
        )
        expected, want = apply_gradients(expected, grads, sums)
    donated = jax.tree.map(jnp.copy, state)
    for _ in range(3):
        donated, metrics = step(donated, batch)
    assert int(donated.step) == 3
    np.testing.assert_array_equal(donated.rng, state.rng)
    for a, b in zip(jax.tree.leaves(donated.params), jax.tree.leaves(expected.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["loss"], want["loss"], rtol=1e-5)
    assert set(metrics) == {"loss", "cross_entropy", "nll", "tokens", "correct", "grad_norm"}
    assert float(metrics["tokens"]) == 3 + 5  # non-pad tgt_out positions


def test_dropout_key_changes_with_the_step(setup):
    _, _, state = setup
    later = state.replace(step=state.step + 1)
    assert not np.array_equal(dropout_key(state), dropout_key(later))
    assert not np.array_equal(dropout_key(state, 0), dropout_key(state, 1))


def test_accumulated_micro_batches_sum_to_the_whole_batch_without_dropout(setup):
    _, batch, state = setup
    model = Transformer(CFG.replace(dropout_rate=0.0))
    grads, sums = compute_gradients(model, state.params, batch, dropout_key(state))
    acc = zero_accumulator(state.params)
    for i, rows in enumerate([slice(0, 1), slice(1, 2)]):
        micro = {k: v[rows] for k, v in batch.items()}
        acc = accumulate_gradients(acc, state, micro, i, model=model)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(acc[0]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert set(acc[1]) == set(sums)
    for key in sums:
        np.testing.assert_allclose(sums[key], acc[1][key], rtol=1e-5)


def test_decoder_only_model_learns_a_sequence():
    """A decoder-only model (no ``src`` in the batch) trains through the same step."""
    cfg = CFG.replace(dropout_rate=0.0)
    model = Decoder(cfg)
    batch = make_batch(None, [[4, 5, 6, 7, 8, 9]] * 2)
    params = nn.unbox(jax.jit(model.init)(jax.random.key(1), batch["tgt_in"])["params"])
    tx = transformer_optimizer(transformer_schedule(cfg.d_model, 5))
    state = create_train_state(params, tx, jax.random.PRNGKey(0))
    step = jax.jit(functools.partial(train_step, model=model, label_smoothing=0.0))
    before = eval_step(state.params, batch, model=model, label_smoothing=0.0)
    for _ in range(20):
        state, _ = step(state, batch)
    after = eval_step(state.params, batch, model=model, label_smoothing=0.0)
    assert float(after["loss"]) < 0.01 * float(before["loss"])
    assert float(after["correct"]) == float(after["tokens"]) == 14


def test_bad_convention_in_the_run_config_names_the_field():
    config = schema.default_config()
    config.train.label_smoothing_convention = "pytorch"
    with pytest.raises(ValueError, match="train.label_smoothing_convention"):
        validate_config(RunConfig.from_config(config))
