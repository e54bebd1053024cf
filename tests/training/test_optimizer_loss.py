"""The paper's learning-rate schedule (§5.3) and label-smoothed loss (§5.4), by hand."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer_jax.training.loss import (
    loss_and_metrics,
    smoothed_cross_entropy,
    smoothed_target,
    summarize,
)
from transformer_jax.training.optimizer import (
    transformer_optimizer,
    transformer_schedule,
    with_cooldown,
)
from transformer_jax.training.run import init_state, run_schedule
from transformer_jax.training.schema import RunConfig, default_config
from transformer_jax.training.steps import apply_gradients, create_train_state
from transformer_jax.training.validation import validate_config


def paper_lr(step, d_model=512, warmup=4000, scale=1.0):
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@pytest.mark.parametrize("step", [1, 2, 100, 3999, 4000, 4001, 10_000, 100_000])
def test_schedule_matches_equation_3(step):
    schedule = transformer_schedule(512, 4000)
    # optax passes the number of updates already applied: count = step - 1
    np.testing.assert_allclose(float(schedule(step - 1)), paper_lr(step), rtol=1e-6)


def test_schedule_peaks_at_warmup_and_scales():
    schedule = transformer_schedule(512, 4000, scale=2.0)
    values = np.array([float(schedule(s - 1)) for s in (3999, 4000, 4001)])
    assert values.argmax() == 1
    np.testing.assert_allclose(values[1], 2.0 * 512**-0.5 * 4000**-0.5, rtol=1e-6)


def test_schedule_rejects_bad_values():
    with pytest.raises(ValueError, match="train.warmup_steps"):
        transformer_schedule(512, 0)
    with pytest.raises(ValueError, match="train.learning_rate_scale"):
        transformer_schedule(512, 10, scale=-1.0)


def test_cooldown_falls_linearly_to_zero_over_the_last_steps():
    paper = transformer_schedule(16, 3)
    cooled = with_cooldown(paper, num_steps=10, cooldown_steps=4)
    # updates 1-6 (count 0-5) at the paper's rate, then 4/4, 3/4, 2/4, 1/4 of it
    factors = [1, 1, 1, 1, 1, 1, 1, 0.75, 0.5, 0.25]
    for count, factor in enumerate(factors):
        expected = factor * paper_lr(count + 1, d_model=16, warmup=3)
        np.testing.assert_allclose(float(cooled(count)), expected, rtol=1e-6, err_msg=count)
    assert float(cooled(10)) == 0.0 and float(cooled(50)) == 0.0
    assert with_cooldown(paper, 10, 0) is paper
    for bad in (-1, 11):
        with pytest.raises(ValueError, match="train.cooldown_steps"):
            with_cooldown(paper, 10, bad)


def test_a_training_runs_updates_follow_train_cooldown_steps():
    """Adam's moments do not depend on the rate: with the same gradients, the cooled run's
    update is the factor times the plain run's, update by update."""
    config = default_config()
    config.model.update(vocab_size=260, d_model=16, num_heads=2, d_ff=32)
    config.model.update(num_encoder_layers=1, num_decoder_layers=1)
    config.train.update(num_steps=4, warmup_steps=2, cooldown_steps=3)
    plain = config.copy_and_resolve_references()
    plain.train.cooldown_steps = 0
    plain, config = RunConfig.from_config(plain), RunConfig.from_config(config)
    model_config = validate_config(config)
    states = [init_state(model_config, c) for c in (plain, config)]
    grads = jax.tree.map(jnp.ones_like, states[0].params)
    opt = [s.opt_state for s in states]
    for count, factor in enumerate([1.0, 1.0, 2 / 3, 1 / 3]):
        (a, opt[0]), (b, opt[1]) = (
            s.tx.update(grads, o, s.params) for s, o in zip(states, opt, strict=True)
        )
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_allclose(y, factor * x, rtol=1e-5, atol=1e-12, err_msg=count)
        rate = float(run_schedule(config, model_config)(count))
        assert rate == pytest.approx(factor * float(run_schedule(plain, model_config)(count)))


def test_optimizer_is_adam_with_the_papers_betas():
    """Adam(0.9, 0.98, 1e-9) by hand over several updates: gradients that change from step to
    step pin beta1 and beta2 (the first update is g / (|g| + eps) whatever they are), and a
    gradient of the order of eps pins eps."""
    schedule = transformer_schedule(16, 10)
    rng = np.random.default_rng(0)
    grads = rng.normal(size=(6, 4)) * np.array([1.0, 0.1, 3.0, 1e-9])
    b1, b2, eps = 0.9, 0.98, 1e-9  # §5.3
    m, v = np.zeros(4), np.zeros(4)
    params = {"w": jnp.array([1.0, -2.0, 3.0, 0.5])}
    tx = transformer_optimizer(schedule)
    state = tx.init(params)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        expected = -paper_lr(t, d_model=16, warmup=10) * m_hat / (np.sqrt(v_hat) + eps)
        updates, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state, params)
        np.testing.assert_allclose(updates["w"], expected, rtol=2e-5, err_msg=f"update {t}")


def test_weight_decay_is_decoupled_and_skips_vectors():
    """AdamW by hand: ``update = -rate * (adam_direction + weight_decay * param)`` on the
    matrices; biases and LayerNorm parameters (vectors) get Adam's update alone."""
    schedule = transformer_schedule(16, 10)
    params = {"kernel": jnp.array([[1.0, -2.0], [3.0, 0.5]]), "bias": jnp.array([1.0, -4.0])}
    grads = {"kernel": jnp.array([[0.5, -1.0], [2.0, 0.0]]), "bias": jnp.array([3.0, 0.0])}
    tx = transformer_optimizer(schedule, weight_decay=0.1)
    updates, _ = tx.update(grads, tx.init(params), params)
    rate = paper_lr(1, d_model=16, warmup=10)
    adam = {k: np.sign(np.asarray(g)) for k, g in grads.items()}  # step 1: g / |g|
    np.testing.assert_allclose(
        updates["kernel"], -rate * (adam["kernel"] + 0.1 * np.asarray(params["kernel"])), rtol=1e-5
    )
    np.testing.assert_allclose(updates["bias"], -rate * adam["bias"], rtol=1e-5)
    adam_tx = transformer_optimizer(schedule)
    plain, _ = adam_tx.update(grads, adam_tx.init(params), params)
    assert not np.allclose(plain["kernel"], updates["kernel"])
    with pytest.raises(ValueError, match="train.weight_decay"):
        transformer_optimizer(schedule, weight_decay=-0.1)


def test_apply_gradients_reports_the_norm_of_the_per_token_gradient():
    params = {"w": jnp.array([1.0, -2.0]), "b": jnp.array([[0.5]])}
    summed = {"w": jnp.array([3.0, 4.0]), "b": jnp.array([[12.0]])}  # norm 13 over 4 tokens
    tx = transformer_optimizer(transformer_schedule(16, 10))
    state = create_train_state(params, tx, jax.random.PRNGKey(0))
    step = jax.jit(apply_gradients)
    new, metrics = step(state, summed, {"tokens": jnp.float32(4.0)})
    assert float(metrics["grad_norm"]) == pytest.approx(13.0 / 4.0, rel=1e-6)
    # the update is Adam's on the per-token gradient (the sums divided by the token count)
    updates, _ = tx.update(jax.tree.map(lambda g: g / 4.0, summed), tx.init(params), params)
    expected = optax.apply_updates(params, updates)
    for key in params:
        np.testing.assert_allclose(new.params[key], expected[key], rtol=1e-6)
    assert int(new.step) == 1


def test_smoothed_loss_by_hand():
    # V = 4, eps = 0.1: the target gets 0.9, each other token 0.1 / 3 (tensor2tensor).
    logits = jnp.array([[[2.0, 0.0, -1.0, 0.5]]])
    targets = jnp.array([[0]])
    log_p = np.log(np.exp([2.0, 0.0, -1.0, 0.5]) / np.exp([2.0, 0.0, -1.0, 0.5]).sum())
    q = np.array([0.9, 0.1 / 3, 0.1 / 3, 0.1 / 3])
    expected = -(q * log_p).sum() + (q * np.log(q)).sum()  # KL(q || p)
    got = smoothed_cross_entropy(logits, targets, 0.1)
    np.testing.assert_allclose(float(got[0, 0]), expected, rtol=1e-6)
    # no smoothing: plain negative log-likelihood
    np.testing.assert_allclose(
        float(smoothed_cross_entropy(logits, targets, 0.0)[0, 0]), -log_p[0], rtol=1e-6
    )


def test_loss_ignores_pad_positions_and_sums():
    logits = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 5))
    targets = jnp.array([[1, 2, 0], [3, 0, 0]])  # 3 real tokens, pad id 0
    loss, m = loss_and_metrics(logits, targets, pad_id=0, label_smoothing=0.1)
    per_token = smoothed_cross_entropy(logits, targets, 0.1)
    expected = per_token[0, 0] + per_token[0, 1] + per_token[1, 0]
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-6)
    assert float(m["tokens"]) == 3.0
    predicted = np.asarray(logits.argmax(-1))
    correct = sum(predicted[i, j] == targets[i, j] for i, j in [(0, 0), (0, 1), (1, 0)])
    assert float(m["correct"]) == correct
    # changing logits at pad positions changes nothing
    loss2, _ = loss_and_metrics(logits.at[1, 2].set(100.0), targets, 0, 0.1)
    assert float(loss2) == float(loss)
    s = summarize({k: float(v) for k, v in m.items()})
    np.testing.assert_allclose(s["perplexity"], math.exp(float(m["nll"]) / 3), rtol=1e-5)
    assert s["accuracy"] == correct / 3


def test_loss_is_float32_for_bfloat16_logits():
    logits = jnp.ones((1, 2, 7), jnp.bfloat16)
    loss, _ = loss_and_metrics(logits, jnp.array([[1, 2]]), 0, 0.1)
    assert loss.dtype == jnp.float32


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.3])
def test_loss_gradient_is_softmax_minus_smoothed_target(label_smoothing):
    # d/dlogits of KL(q || softmax(logits)) = softmax(logits) - q, by hand (V = 4)
    logits = jnp.array([[[2.0, 0.0, -1.0, 0.5], [0.3, 0.3, -2.0, 1.0]]])
    targets = jnp.array([[0, 3]])
    grad = jax.grad(lambda x: smoothed_cross_entropy(x, targets, label_smoothing).sum())(logits)
    low = label_smoothing / 3
    for row, target in ((0, 0), (1, 3)):
        z = np.asarray(logits[0, row], np.float64)
        q = np.full(4, low)
        q[target] = 1.0 - label_smoothing
        expected = np.exp(z) / np.exp(z).sum() - q
        np.testing.assert_allclose(grad[0, row], expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("convention", ["t2t", "uniform"])
def test_custom_loss_and_gradient_equal_autodiff_of_the_formula(convention):
    """The loss (from the log-sum-exp, the target logit and the logits' sum) and its custom
    gradient equal KL(q || softmax) written with log-probabilities and a one-hot q."""
    logits = 3.0 * jax.random.normal(jax.random.PRNGKey(1), (3, 5, 11))
    targets = jax.random.randint(jax.random.PRNGKey(2), (3, 5), 0, 11)
    weights = jax.random.uniform(jax.random.PRNGKey(3), (3, 5))
    eps = 0.1 * 11 / 10 if convention == "t2t" else 0.1  # t2t: 0.9 / 0.01; uniform: 0.9 + 0.1/11

    def formula(x):  # the textbook form, differentiated by JAX
        log_p = jax.nn.log_softmax(x)
        q = optax.smooth_labels(jax.nn.one_hot(targets, 11), eps)
        return ((q * (jnp.log(q) - log_p)).sum(-1) * weights).sum()

    def ours(x):
        return (smoothed_cross_entropy(x, targets, 0.1, convention) * weights).sum()

    np.testing.assert_allclose(ours(logits), formula(logits), rtol=1e-5)
    np.testing.assert_allclose(
        jax.grad(ours)(logits), jax.grad(formula)(logits), rtol=1e-5, atol=1e-6
    )
    # and through jit, with bfloat16 logits the gradient keeps their dtype
    bf16 = jax.jit(jax.grad(lambda x: smoothed_cross_entropy(x, targets, 0.1).sum()))
    assert bf16(logits.astype(jnp.bfloat16)).dtype == jnp.bfloat16


@pytest.mark.parametrize("convention", ["t2t", "uniform"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.3])
def test_cross_entropy_metric_equals_optax(convention, label_smoothing):
    """The ``cross_entropy`` metric is optax's softmax cross-entropy against q: with
    'uniform' against ``optax.smooth_labels`` itself (PyTorch's convention), with 't2t'
    against the same call at eps * V / (V - 1), which gives eps / (V - 1) to each other token.
    """
    vocab = 11
    logits = 3.0 * jax.random.normal(jax.random.PRNGKey(4), (2, 5, vocab))
    targets = jax.random.randint(jax.random.PRNGKey(5), (2, 5), 1, vocab).at[1, 3:].set(0)
    eps = label_smoothing * (vocab / (vocab - 1) if convention == "t2t" else 1.0)
    q = optax.smooth_labels(jax.nn.one_hot(targets, vocab), eps)
    reference = optax.softmax_cross_entropy(logits, q)
    weights = np.asarray(targets != 0)
    loss, m = loss_and_metrics(logits, targets, 0, label_smoothing, convention)
    np.testing.assert_allclose(m["cross_entropy"], reference[weights].sum(), rtol=1e-5)
    # the optimised loss is the KL form: the cross-entropy less the target's entropy
    entropy = -(q * np.log(np.where(q > 0, q, 1.0))).sum(-1)
    np.testing.assert_allclose(loss, (reference - entropy)[weights].sum(), rtol=1e-5)
    np.testing.assert_allclose(
        m["nll"],
        optax.softmax_cross_entropy_with_integer_labels(logits, targets)[weights].sum(),
        rtol=1e-5,
    )
    s = summarize({k: float(v) for k, v in m.items()})
    np.testing.assert_allclose(s["cross_entropy"], reference[weights].mean(), rtol=1e-5)
    np.testing.assert_allclose(s["nll"], float(m["nll"]) / weights.sum(), rtol=1e-6)


def test_uniform_convention_by_hand():
    # V = 4, eps = 0.1: every token gets 0.1 / 4 = 0.025, the reference 0.9 + 0.025.
    z = np.array([2.0, 0.0, -1.0, 0.5])
    log_p = z - np.log(np.exp(z).sum())
    q = np.array([0.925, 0.025, 0.025, 0.025])
    logits, targets = jnp.asarray(z)[None, None], jnp.array([[0]])
    _, m = loss_and_metrics(logits, targets, pad_id=1, label_smoothing=0.1, convention="uniform")
    np.testing.assert_allclose(float(m["cross_entropy"]), -(q * log_p).sum(), rtol=1e-6)
    kl = smoothed_cross_entropy(logits, targets, 0.1, "uniform")
    np.testing.assert_allclose(float(kl[0, 0]), (q * (np.log(q) - log_p)).sum(), rtol=1e-5)
    assert smoothed_target(4, 0.1, "uniform")[:2] == pytest.approx((0.925, 0.025))
    assert smoothed_target(4, 0.1, "t2t")[:2] == pytest.approx((0.9, 0.1 / 3))
    grad = jax.grad(lambda x: smoothed_cross_entropy(x, targets, 0.1, "uniform").sum())(logits)
    np.testing.assert_allclose(grad[0, 0], np.exp(log_p) - q, rtol=1e-5, atol=1e-7)


def test_unknown_convention_names_the_field():
    with pytest.raises(ValueError, match="label_smoothing_convention"):
        loss_and_metrics(jnp.zeros((1, 1, 4)), jnp.array([[1]]), 0, 0.1, "torch")
