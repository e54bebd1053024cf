"""Adam with the paper's warmup / inverse-square-root learning rate (§5.3, equation 3), an
optional linear decay to zero over a run's last steps, and optional decoupled weight decay."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax


def transformer_schedule(
    d_model: int, warmup_steps: int = 4000, scale: float = 1.0
) -> optax.Schedule:
    """``lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)`` (eq. 3).

    The paper counts steps from 1; optax passes the number of updates already applied
    (0 for the first update), so the schedule evaluates the formula at ``count + 1``.
    The rate rises linearly for ``warmup_steps`` and peaks at ``step = warmup_steps``.
    """
    if d_model <= 0:
        raise ValueError(f"model.d_model must be positive, got {d_model}")
    if warmup_steps <= 0:
        raise ValueError(f"train.warmup_steps must be positive, got {warmup_steps}")
    if scale <= 0:
        raise ValueError(f"train.learning_rate_scale must be positive, got {scale}")

    def schedule(count: jnp.ndarray) -> jnp.ndarray:
        step = jnp.asarray(count, jnp.float32) + 1.0
        return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

    return schedule


def with_cooldown(schedule: optax.Schedule, num_steps: int, cooldown_steps: int) -> optax.Schedule:
    """``schedule`` times a factor that falls linearly from 1 to 0 over the last
    ``cooldown_steps`` of ``num_steps`` updates: ``min(1, (num_steps - count) /
    cooldown_steps)``, so the last update runs at ``1 / cooldown_steps`` of the rate.

    Not in the paper, which trains at the inverse-square-root rate to the end and averages
    the last checkpoints (§6.1); ``cooldown_steps = 0`` returns ``schedule`` itself.
    """
    if not 0 <= cooldown_steps <= num_steps:
        raise ValueError(
            f"train.cooldown_steps must be between 0 and train.num_steps ({num_steps}), "
            f"got {cooldown_steps}"
        )
    if cooldown_steps == 0:
        return schedule

    def cooled(count: jnp.ndarray) -> jnp.ndarray:
        left = num_steps - jnp.asarray(count, jnp.float32)
        return schedule(count) * jnp.clip(left / cooldown_steps, 0.0, 1.0)

    return cooled


def is_matrix(params: Any) -> Any:
    """True for each parameter with two or more axes: the weight matrices and embeddings,
    not the biases or LayerNorm's scales and offsets."""
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def transformer_optimizer(
    schedule: optax.Schedule,
    b1: float = 0.9,
    b2: float = 0.98,
    eps: float = 1e-9,
    weight_decay: float = 0.0,
) -> optax.GradientTransformation:
    """Adam(beta1 = 0.9, beta2 = 0.98, epsilon = 1e-9) driven by ``schedule`` (§5.3).

    ``weight_decay > 0`` (not in the paper): AdamW's decoupled decay (Loshchilov & Hutter
    2019), ``param -= rate(step) * weight_decay * param`` on the matrices (:func:`is_matrix`).
    """
    if weight_decay < 0:
        raise ValueError(f"train.weight_decay must be >= 0, got {weight_decay}")
    if weight_decay == 0:
        return optax.adam(schedule, b1=b1, b2=b2, eps=eps)
    return optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=is_matrix)
