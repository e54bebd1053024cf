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

import math

import jax
import jax.numpy as jnp

Array = jax.Array


def smoothed_cross_entropy(logits: Array, targets: Array, label_smoothing: float) -> Array:
    """Per-token KL(smoothed one-hot || softmax(logits)), float32 ``[B, T]``."""
    vocab = logits.shape[-1]
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab - 1)
    target_log_prob = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    cross_entropy = -(confidence * target_log_prob + low * (log_probs.sum(-1) - target_log_prob))
    entropy = -confidence * jnp.log(confidence) if confidence > 0 else 0.0
    if low > 0:
        entropy = entropy - (vocab - 1) * low * jnp.log(low)
    return cross_entropy - entropy


def loss_and_metrics(
    logits: Array, targets: Array, pad_id: int, label_smoothing: float
) -> tuple[Array, dict[str, Array]]:
    """Summed smoothed loss over non-pad targets and the metric sums.

    Returns ``(loss_sum, {'loss', 'nll', 'tokens', 'correct'})``: float32 sums over the
    non-pad positions of ``targets`` (``tokens`` counts them).
    """
    weights = (targets != pad_id).astype(jnp.float32)
    loss = (smoothed_cross_entropy(logits, targets, label_smoothing) * weights).sum()
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -(jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0] * weights).sum()
    correct = ((logits.argmax(-1) == targets) * weights).sum()
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
