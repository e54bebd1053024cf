"""Adam with the paper's warmup / inverse-square-root learning rate (§5.3, equation 3)."""

from __future__ import annotations

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


def transformer_optimizer(
    schedule: optax.Schedule, b1: float = 0.9, b2: float = 0.98, eps: float = 1e-9
) -> optax.GradientTransformation:
    """Adam(beta1 = 0.9, beta2 = 0.98, epsilon = 1e-9) driven by ``schedule`` (§5.3)."""
    return optax.adam(schedule, b1=b1, b2=b2, eps=eps)
