"""Pure training and evaluation steps (one device's work; see ``parallel`` for many).

The batch the steps take: a dict of int32 ``[batch, length]`` arrays, made from token
ids by :func:`make_batch` (or by :mod:`transformer_jax.data.batching` for a corpus):

* ``src``: source ids + EOS, then PAD. Absent for a decoder-only model.
* ``tgt_in``: the decoder's input, BOS + target ids, then PAD ("shifted right", §3.1).
  It starts with BOS, never PAD: PAD is masked as an attention key, so a first token of
  PAD would leave the first query nothing to attend to.
* ``tgt_out``: what each position of ``tgt_in`` predicts, target ids + EOS, then PAD;
  positions holding the pad id carry no loss.
* optionally ``src_segments``, ``tgt_segments``, ``src_positions``, ``tgt_positions``
  for packed rows (several pairs per row; :mod:`transformer_jax.data.batching`).

The model is applied as ``model.apply({'params': p}, src, tgt_in, **packing)`` or, when
the batch has no ``src``, ``model.apply({'params': p}, tgt_in, **packing)``, and returns
logits ``[batch, length, vocab]``; any Flax module with that call works.

``train_step(state, batch, *, model) -> (state, metrics)`` takes its dropout key from
the state: the update that makes step ``s = state.step + 1`` uses ``fold_in(state.rng,
s)`` (:func:`dropout_key`). A step is thus a pure function of ``(state, batch)``: the
state can be donated (nothing outside it is read after the call) and a resumed run
repeats an uninterrupted one. The step sums the label-smoothed loss and its gradient
over the batch, sums both over the device axis (when given), divides by the global count
of non-pad target tokens and applies the optimizer: the update of the token-averaged
loss over the *global* batch. Gradient accumulation runs ``accumulate_gradients`` on
several micro-batches and ``apply_gradients`` once, the same update as one step on the
concatenated batch. Metrics are sums (:func:`transformer_jax.training.loss.summarize`
gives per-token values).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer_jax.ids import BOS_ID, EOS_ID, PAD_ID
from transformer_jax.training.loss import check_convention, loss_and_metrics

Array = jax.Array
Batch = dict[str, Array]
Metrics = dict[str, Array]

SEGMENT_KEYS = ("src_segments", "tgt_segments", "src_positions", "tgt_positions")
METRIC_KEYS = ("loss", "cross_entropy", "nll", "tokens", "correct")


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training: a pytree, checkpointed as a whole."""

    step: Array  # int32 number of updates applied
    params: Any
    opt_state: Any
    rng: Array  # base dropout key; update s (counted from 1) uses fold_in(rng, s)
    tx: optax.GradientTransformation = flax.struct.field(pytree_node=False)


def create_train_state(params: Any, tx: optax.GradientTransformation, rng: Array) -> TrainState:
    """Step 0, ``tx.init(params)`` and the base dropout key ``rng`` (raw or typed)."""
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), rng, tx)


def dropout_key(state: TrainState, micro_step: Array | int | None = None) -> Array:
    """The dropout key of the update ``state.step + 1`` (of its micro-batch ``micro_step``
    when accumulating gradients)."""
    key = jax.random.fold_in(state.rng, state.step + 1)
    return key if micro_step is None else jax.random.fold_in(key, micro_step)


def make_batch(
    src_ids: Sequence[Sequence[int]] | None,
    tgt_ids: Sequence[Sequence[int]],
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int | None = EOS_ID,
    length: int | None = None,
    vocab_size: int | None = None,
) -> dict[str, np.ndarray]:
    """The batch the steps take (module doc) from token ids without specials.

    Args:
      src_ids: one id sequence per row, or ``None`` for a decoder-only model (no ``src``).
      tgt_ids: one id sequence per row.
      pad_id, bos_id, eos_id: the special ids; with ``eos_id=None`` no EOS is appended
        (e.g. windows cut from a running text): ``tgt_in`` = BOS + ids[:-1],
        ``tgt_out`` = ids.
      length: pad every array to this length (fixed shapes compile once); default: the
        longest row of each.
      vocab_size: ids must lie in ``[0, vocab_size)`` (negative ids are always refused).

    Returns:
      int32 numpy arrays ``src`` (when given), ``tgt_in``, ``tgt_out``.
    """
    end = [] if eos_id is None else [eos_id]
    targets = [list(ids) + end for ids in tgt_ids]
    rows = {"tgt_in": [[bos_id] + t[:-1] for t in targets], "tgt_out": targets}
    if src_ids is not None:
        if len(src_ids) != len(tgt_ids):
            raise ValueError(f"src_ids has {len(src_ids)} rows but tgt_ids has {len(tgt_ids)}")
        rows = {"src": [list(ids) + end for ids in src_ids], **rows}
    if not targets:
        raise ValueError("make_batch needs at least one row")
    batch = {}
    for key, value in rows.items():
        longest = max(map(len, value))
        width = longest if length is None else length
        if longest == 0:
            raise ValueError(f"{key}: every row is empty")
        if longest > width:
            raise ValueError(f"{key} rows of up to {longest} ids exceed length={width}")
        out = np.full((len(value), width), pad_id, np.int32)
        for r, ids in enumerate(value):
            out[r, : len(ids)] = ids
        low, high = int(out.min()), int(out.max())
        if low < 0 or (vocab_size is not None and high >= vocab_size):
            bound = "" if vocab_size is None else f" [0, {vocab_size})"
            raise ValueError(
                f"{key} holds id {low if low < 0 else high} outside the vocabulary{bound}"
            )
        batch[key] = out
    return batch


def check_batch(batch: Batch) -> None:
    """The keys the steps read: ``tgt_in`` and ``tgt_out`` (module doc)."""
    missing = [key for key in ("tgt_in", "tgt_out") if key not in batch]
    if missing:
        raise ValueError(
            f"the batch has no {', '.join(map(repr, missing))} (it has {sorted(batch)}); "
            "make_batch makes one"
        )


def _pad_id(model: nn.Module) -> int:
    """The model's pad id (``model.config.pad_id``), else :data:`transformer_jax.ids.PAD_ID`."""
    return getattr(getattr(model, "config", None), "pad_id", PAD_ID)


def _forward(model: nn.Module, params: Any, batch: Batch, rng: Array | None) -> Array:
    check_batch(batch)
    extra = {k: batch[k] for k in SEGMENT_KEYS if k in batch}
    inputs = (batch["src"], batch["tgt_in"]) if "src" in batch else (batch["tgt_in"],)
    return model.apply(
        {"params": params},
        *inputs,
        **extra,
        deterministic=rng is None,
        rngs=None if rng is None else {"dropout": rng},
    )


def _device_rng(rng: Array, axis_name: str | None) -> Array:
    """A distinct dropout key per device: fold in the device's index on the axis."""
    return rng if axis_name is None else jax.random.fold_in(rng, jax.lax.axis_index(axis_name))


def compute_gradients(
    model: nn.Module,
    params: Any,
    batch: Batch,
    rng: Array,
    *,
    label_smoothing: float = 0.1,
    label_smoothing_convention: str = "t2t",
    axis_name: str | None = None,
) -> tuple[Any, Metrics]:
    """Gradient of the *summed* loss on this device's batch (dropout key ``rng``) and its
    metric sums."""
    check_convention(label_smoothing_convention)
    pad_id = _pad_id(model)

    def loss_fn(p: Any) -> tuple[Array, Metrics]:
        logits = _forward(model, p, batch, _device_rng(rng, axis_name))
        return loss_and_metrics(
            logits, batch["tgt_out"], pad_id, label_smoothing, label_smoothing_convention
        )

    grads, metrics = jax.grad(loss_fn, has_aux=True)(params)
    return grads, metrics


def apply_gradients(
    state: TrainState, grads: Any, metrics: Metrics, *, axis_name: str | None = None
) -> tuple[TrainState, Metrics]:
    """Sum gradient and metric sums over devices, normalise per token, take an Adam step."""
    if axis_name is not None:
        grads, metrics = jax.lax.psum((grads, metrics), axis_name)
    scale = 1.0 / jnp.maximum(metrics["tokens"], 1.0)
    # The per-token gradient's norm, taken of the sums and then scaled: XLA's CPU backend
    # then squares and sums each gradient in one pass instead of writing the squares out.
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads) * scale)
    grads = jax.tree.map(lambda g: g * scale, grads)
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def train_step(
    state: TrainState,
    batch: Batch,
    *,
    model: nn.Module,
    label_smoothing: float = 0.1,
    label_smoothing_convention: str = "t2t",
    axis_name: str | None = None,
) -> tuple[TrainState, Metrics]:
    """One optimizer step on one batch (per device when ``axis_name`` is set).

    Args:
      state: from :func:`create_train_state`; its key gives the dropout (module doc).
      batch: ``src`` (optional), ``tgt_in``, ``tgt_out`` (:func:`make_batch`).
      model: the Flax module; label_smoothing, label_smoothing_convention: the loss
        (:mod:`transformer_jax.training.loss`; paper: 0.1, ``'t2t'``).
      axis_name: the device axis under ``pmap`` / ``shard_map``.

    Returns:
      The new state and the metric sums of the global batch (``loss``,
      ``cross_entropy``, ``nll``, ``tokens``, ``correct``, and ``grad_norm``).
    """
    grads, metrics = compute_gradients(
        model,
        state.params,
        batch,
        dropout_key(state),
        label_smoothing=label_smoothing,
        label_smoothing_convention=label_smoothing_convention,
        axis_name=axis_name,
    )
    return apply_gradients(state, grads, metrics, axis_name=axis_name)


def accumulate_gradients(
    accumulated: tuple[Any, Metrics],
    state: TrainState,
    batch: Batch,
    micro_step: Array | int,
    *,
    model: nn.Module,
    label_smoothing: float = 0.1,
    label_smoothing_convention: str = "t2t",
    axis_name: str | None = None,
) -> tuple[Any, Metrics]:
    """Add micro-batch ``micro_step``'s gradient and metric sums to ``accumulated`` (local;
    no psum). Its dropout key is ``dropout_key(state, micro_step)``."""
    grads, metrics = compute_gradients(
        model,
        state.params,
        batch,
        dropout_key(state, micro_step),
        label_smoothing=label_smoothing,
        label_smoothing_convention=label_smoothing_convention,
        axis_name=axis_name,
    )
    return jax.tree.map(jnp.add, accumulated, (grads, metrics))


def zero_accumulator(params: Any) -> tuple[Any, Metrics]:
    """Empty gradient and metric sums for ``accumulate_gradients``."""
    metrics = dict.fromkeys(METRIC_KEYS, jnp.zeros((), jnp.float32))
    return jax.tree.map(jnp.zeros_like, params), metrics


def eval_step(
    params: Any,
    batch: Batch,
    *,
    model: nn.Module,
    label_smoothing: float = 0.1,
    label_smoothing_convention: str = "t2t",
    axis_name: str | None = None,
) -> Metrics:
    """Metric sums (smoothed loss, cross-entropy, NLL, tokens, correct) without dropout."""
    logits = _forward(model, params, batch, None)
    _, metrics = loss_and_metrics(
        logits, batch["tgt_out"], _pad_id(model), label_smoothing, label_smoothing_convention
    )
    if axis_name is not None:
        metrics = jax.lax.psum(metrics, axis_name)
    return metrics
