"""Label-smoothed cross-entropy over non-pad target tokens (§5.4), and its metrics.

Smoothing follows tensor2tensor: the target distribution puts ``1 - eps`` on the
reference token and spreads ``eps`` uniformly over the ``V - 1`` other tokens
(``optax.smooth_labels`` would instead give ``eps / V`` to every token, the reference
included). Pad is a valid class like any other here, as in tensor2tensor; pad
*positions* are excluded by the weights. The loss subtracts the entropy of the smoothed
target (the KL-divergence form), so a perfect model scores 0 and ``exp(loss)`` is
comparable across smoothing values; the unsmoothed negative log-likelihood is reported
as well, for perplexity.

All functions return *sums* (loss, tokens, correct predictions) so that values from
several devices or gradient-accumulation steps add up exactly; divide by ``tokens`` at
the end.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

Array = jax.Array


def _log_normalizer(logits: Array) -> tuple[Array, Array]:
    """Row maximum and log-sum-exp of float32 ``logits`` (the max shared by both)."""
    peak = logits.max(-1)
    return peak, peak + jnp.log(jnp.exp(logits - peak[..., None]).sum(-1))


def _smoothing(vocab: int, label_smoothing: float) -> tuple[float, float, float]:
    """(confidence, low, entropy of the smoothed target) for ``vocab`` classes."""
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab - 1)
    entropy = -confidence * math.log(confidence) if confidence > 0 else 0.0
    if low > 0:
        entropy -= (vocab - 1) * low * math.log(low)
    return confidence, low, entropy


def _smoothed_cross_entropy_and_lse(
    logits: Array, targets: Array, label_smoothing: float
) -> tuple[Array, Array]:
    logits = logits.astype(jnp.float32)
    vocab = logits.shape[-1]
    confidence, low, entropy = _smoothing(vocab, label_smoothing)
    _, lse = _log_normalizer(logits)
    target_log_prob = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - lse
    sum_log_probs = logits.sum(-1) - vocab * lse
    cross_entropy = -(confidence * target_log_prob + low * (sum_log_probs - target_log_prob))
    return cross_entropy - entropy, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def smoothed_cross_entropy(logits: Array, targets: Array, label_smoothing: float) -> Array:
    """Per-token KL(smoothed one-hot || softmax(logits)), float32 ``[B, T]``.

    With ``log p = logits - lse`` and ``q`` the smoothed target (``confidence`` on the
    reference, ``low`` elsewhere): ``-sum_v q_v log p_v - H(q)``. Its gradient,
    ``softmax(logits) - q``, is a custom VJP computed in one pass over the logits (XLA's
    derivative of ``log_softmax`` and ``take_along_axis`` made several, and a scatter).
    """
    return _smoothed_cross_entropy_and_lse(logits, targets, label_smoothing)[0]


def _smoothed_cross_entropy_fwd(
    logits: Array, targets: Array, label_smoothing: float
) -> tuple[Array, tuple[Array, Array, Array]]:
    loss, lse = _smoothed_cross_entropy_and_lse(logits, targets, label_smoothing)
    return loss, (logits, targets, lse)


def _smoothed_cross_entropy_bwd(
    label_smoothing: float, residuals: tuple[Array, Array, Array], g: Array
) -> tuple[Array, None]:
    logits, targets, lse = residuals
    confidence, low, _ = _smoothing(logits.shape[-1], label_smoothing)
    classes = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    q = jnp.where(classes == targets[..., None], confidence, low)
    softmax = jnp.exp(logits.astype(jnp.float32) - lse[..., None])
    return (g[..., None] * (softmax - q)).astype(logits.dtype), None


smoothed_cross_entropy.defvjp(_smoothed_cross_entropy_fwd, _smoothed_cross_entropy_bwd)


def loss_and_metrics(
    logits: Array, targets: Array, pad_id: int, label_smoothing: float
) -> tuple[Array, dict[str, Array]]:
    """Summed smoothed loss over non-pad targets and the metric sums.

    Returns ``(loss_sum, {'loss', 'nll', 'tokens', 'correct'})``: float32 sums over the
    non-pad positions of ``targets`` (``tokens`` counts them). A token is correct when
    its reference has the largest logit.
    """
    weights = (targets != pad_id).astype(jnp.float32)
    loss = (smoothed_cross_entropy(logits, targets, label_smoothing) * weights).sum()
    fixed = jax.lax.stop_gradient(logits.astype(jnp.float32))
    peak, lse = _log_normalizer(fixed)
    target_logit = jnp.take_along_axis(fixed, targets[..., None], axis=-1)[..., 0]
    nll = ((lse - target_logit) * weights).sum()
    correct = ((target_logit >= peak) * weights).sum()
    metrics = {"loss": loss, "nll": nll, "tokens": weights.sum(), "correct": correct}
    return loss, metrics


def summarize(sums: dict[str, float]) -> dict[str, float]:
    """Per-token loss, accuracy and perplexity (exp of the unsmoothed NLL) from sums."""
    tokens = max(float(sums["tokens"]), 1.0)
    nll = float(sums["nll"]) / tokens
    return {
        "loss": float(sums["loss"]) / tokens,
        "accuracy": float(sums["correct"]) / tokens,
        "perplexity": math.exp(min(nll, 50.0)),
    }
