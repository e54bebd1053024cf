"""Training: the batch format and steps, the label-smoothed loss, the paper's optimizer.

The names below are the ones a training script needs; data parallelism (``parallel``),
checkpoints and the loop behind ``train.py`` (``loop``) are imported from their modules.
"""

from transformer_jax.training.loss import loss_and_metrics, smoothed_cross_entropy, summarize
from transformer_jax.training.optimizer import (
    transformer_optimizer,
    transformer_schedule,
    with_cooldown,
)
from transformer_jax.training.steps import (
    TrainState,
    accumulate_gradients,
    apply_gradients,
    create_train_state,
    dropout_key,
    eval_step,
    make_batch,
    train_step,
    zero_accumulator,
)

__all__ = [
    "TrainState",
    "accumulate_gradients",
    "apply_gradients",
    "create_train_state",
    "dropout_key",
    "eval_step",
    "loss_and_metrics",
    "make_batch",
    "smoothed_cross_entropy",
    "summarize",
    "train_step",
    "transformer_optimizer",
    "transformer_schedule",
    "with_cooldown",
    "zero_accumulator",
]
