"""Training: the batch format and steps, the label-smoothed loss, the paper's optimizer.

The names below are the ones a training script needs; data parallelism (``parallel``),
checkpoints and the loop behind ``train.py`` (``loop``) are imported from their modules.

Each name is imported when first used (a module ``__getattr__``): importing the package or
its ``config`` imports no JAX.
"""

from __future__ import annotations

from transformer_jax.lazy import lazy_names

# name -> the module of this package that defines it
_PUBLIC: dict[str, str] = {
    "loss_and_metrics": "loss",
    "smoothed_cross_entropy": "loss",
    "summarize": "loss",
    "transformer_optimizer": "optimizer",
    "transformer_schedule": "optimizer",
    "with_cooldown": "optimizer",
    "TrainState": "steps",
    "accumulate_gradients": "steps",
    "apply_gradients": "steps",
    "create_train_state": "steps",
    "dropout_key": "steps",
    "eval_step": "steps",
    "make_batch": "steps",
    "train_step": "steps",
    "zero_accumulator": "steps",
}
__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
