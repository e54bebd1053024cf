"""Label-smoothed cross-entropy over non-pad target tokens (§5.4), and its metrics.

The smoothed target ``q`` puts ``confidence`` on the reference token and ``low`` on every
other token; ``convention`` says how ``eps = label_smoothing`` is spread:

* ``'t2t'`` (default; tensor2tensor, the paper's code): ``1 - eps`` on the reference,
  ``eps / (V - 1)`` on each of the ``V - 1`` others;
* ``'uniform'`` (``optax.smooth_labels``, PyTorch's ``label_smoothing``): ``eps / V`` on
  every token, the reference included (``1 - eps + eps / V`` on it).

Pad is a valid class like any other, as in tensor2tensor; pad *positions* are excluded
by the weights. The optimised loss is the KL-divergence ``H(q, p) - H(q)``: a perfect
model scores 0 and ``exp(loss)`` is comparable across smoothing values. The metrics also
hold the cross-entropy ``H(q, p)`` against the smoothed target (what
``optax.softmax_cross_entropy`` and PyTorch report) and the unsmoothed negative
log-likelihood (for perplexity).

``loss_and_metrics`` returns *sums* (loss, cross-entropy, NLL, tokens, correct
predictions) so that values from several devices or gradient-accumulation steps add up
exactly; :func:`summarize` divides them by ``tokens``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from transformer_jax.training.config import CONVENTIONS

Array = jax.Array


def check_convention(convention: str, name: str = "label_smoothing_convention") -> None:
    """Raise ``ValueError`` naming ``name`` unless ``convention`` is one of CONVENTIONS."""
    if convention not in CONVENTIONS:
        raise ValueError(f"{name} must be one of {CONVENTIONS}, got {convention!r}")


def smoothed_target(vocab: int, label_smoothing: float, convention: str = "t2t") -> tuple:
    """``(confidence, low, entropy)`` of the smoothed target over ``vocab`` classes.

    ``confidence`` is the reference token's probability, ``low`` every other token's and
    ``entropy`` = H(q), the difference between the cross-entropy and the KL form.
    """
    check_convention(convention)
    if convention == "t2t":
        confidence, low = 1.0 - label_smoothing, label_smoothing / (vocab - 1)
    else:
        low = label_smoothing / vocab
        confidence = 1.0 - label_smoothing + low
    entropy = -confidence * math.log(confidence) if confidence > 0 else 0.0
    if low > 0:
        entropy -= (vocab - 1) * low * math.log(low)
    return confidence, low, entropy


def _log_normalizer(logits: Array) -> tuple[Array, Array]:
    """Row maximum and log-sum-exp of float32 ``logits`` (the max shared by both)."""
    peak = logits.max(-1)
    return peak, peak + jnp.log(jnp.exp(logits - peak[..., None]).sum(-1))


def _cross_entropy_and_lse(
    logits: Array, targets: Array, label_smoothing: float, convention: str
) -> tuple[Array, Array]:
    """H(q, p) per token and the log-sum-exp of the logits."""
    logits = logits.astype(jnp.float32)
    vocab = logits.shape[-1]
    confidence, low, _ = smoothed_target(vocab, label_smoothing, convention)
    _, lse = _log_normalizer(logits)
    target_log_prob = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - lse
    sum_log_probs = logits.sum(-1) - vocab * lse
    return -(confidence * target_log_prob + low * (sum_log_probs - target_log_prob)), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def smoothed_cross_entropy(
    logits: Array, targets: Array, label_smoothing: float, convention: str = "t2t"
) -> Array:
    """Per-token KL(q || softmax(logits)) = H(q, p) - H(q), float32 ``[B, T]``.

    Args:
      logits: ``[..., V]`` (any float dtype; computed in float32).
      targets: int ``[...]`` reference token ids.
      label_smoothing: ``eps`` in [0, 1).
      convention: ``'t2t'`` or ``'uniform'`` (module doc).

    Its gradient, ``softmax(logits) - q``, is a custom VJP computed in one pass over the
    logits (XLA's derivative of ``log_softmax`` and ``take_along_axis`` takes several and a
    scatter).
    """
    cross_entropy, _ = _cross_entropy_and_lse(logits, targets, label_smoothing, convention)
    return cross_entropy - smoothed_target(logits.shape[-1], label_smoothing, convention)[2]


def _smoothed_cross_entropy_fwd(
    logits: Array, targets: Array, label_smoothing: float, convention: str
) -> tuple[Array, tuple[Array, Array, Array]]:
    cross_entropy, lse = _cross_entropy_and_lse(logits, targets, label_smoothing, convention)
    entropy = smoothed_target(logits.shape[-1], label_smoothing, convention)[2]
    return cross_entropy - entropy, (logits, targets, lse)


def _smoothed_cross_entropy_bwd(
    label_smoothing: float, convention: str, residuals: tuple[Array, Array, Array], g: Array
) -> tuple[Array, None]:
    logits, targets, lse = residuals
    confidence, low, _ = smoothed_target(logits.shape[-1], label_smoothing, convention)
    classes = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    q = jnp.where(classes == targets[..., None], confidence, low)
    softmax = jnp.exp(logits.astype(jnp.float32) - lse[..., None])
    return (g[..., None] * (softmax - q)).astype(logits.dtype), None


smoothed_cross_entropy.defvjp(_smoothed_cross_entropy_fwd, _smoothed_cross_entropy_bwd)


def loss_and_metrics(
    logits: Array,
    targets: Array,
    pad_id: int,
    label_smoothing: float,
    convention: str = "t2t",
) -> tuple[Array, dict[str, Array]]:
    """Summed smoothed loss over non-pad targets and the metric sums.

    Args:
      logits: ``[batch, length, V]``; targets: int ``[batch, length]`` (``tgt_out``).
      pad_id: target positions holding it carry no weight.
      label_smoothing, convention: the smoothed target (module doc).

    Returns:
      ``(loss_sum, metrics)``, float32 sums over the non-pad positions: ``loss`` (the KL
      form that is optimised), ``cross_entropy`` (H(q, p)), ``nll`` (-log p of the
      reference), ``tokens`` (their count) and ``correct`` (tokens whose reference has the
      largest logit).
    """
    weights = (targets != pad_id).astype(jnp.float32)
    per_token = smoothed_cross_entropy(logits, targets, label_smoothing, convention)
    loss = (per_token * weights).sum()
    fixed = jax.lax.stop_gradient(logits.astype(jnp.float32))
    peak, lse = _log_normalizer(fixed)
    target_logit = jnp.take_along_axis(fixed, targets[..., None], axis=-1)[..., 0]
    nll = ((lse - target_logit) * weights).sum()
    correct = ((target_logit >= peak) * weights).sum()
    tokens = weights.sum()
    entropy = smoothed_target(logits.shape[-1], label_smoothing, convention)[2]
    metrics = {
        "loss": loss,
        "cross_entropy": jax.lax.stop_gradient(loss) + entropy * tokens,
        "nll": nll,
        "tokens": tokens,
        "correct": correct,
    }
    return loss, metrics


def summarize(sums: dict[str, float]) -> dict[str, float]:
    """Per-token values from metric sums: ``loss``, ``cross_entropy`` (when summed),
    ``nll``, ``accuracy`` and ``perplexity`` (exp of the unsmoothed NLL)."""
    tokens = max(float(sums["tokens"]), 1.0)
    nll = float(sums["nll"]) / tokens
    out = {"loss": float(sums["loss"]) / tokens}
    if "cross_entropy" in sums:
        out["cross_entropy"] = float(sums["cross_entropy"]) / tokens
    out.update(
        nll=nll,
        accuracy=float(sums["correct"]) / tokens,
        perplexity=math.exp(min(nll, 50.0)),
    )
    return out
