"""Data parallelism over all local devices: ``jax.pmap`` or ``jax.jit`` over ``jax.shard_map``.

Both wrap the same per-device functions of ``steps`` with the device axis ``'batch'``:
each device computes gradients on its slice of the global batch, gradients and metric
sums are summed with ``lax.psum`` and divided by the global token count, so any number
of devices performs the same update. The train state is replicated and donated.
Gradient-accumulation buffers stay per device (leading device axis) until the update.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer_jax.training import steps
from transformer_jax.training.config import PARALLEL_KINDS
from transformer_jax.training.steps import TrainState

AXIS = "batch"


def check_kind(kind: str) -> None:
    if kind not in PARALLEL_KINDS:
        raise ValueError(f"train.parallel must be one of {PARALLEL_KINDS}, got {kind!r}")


def shard_batch(batch: dict[str, np.ndarray], num_shards: int, pad_id: int = 0) -> dict:
    """Pad the batch with empty rows to a multiple of ``num_shards`` and split it.

    Returns arrays ``[num_shards, B / num_shards, ...]``. Empty rows (pad tokens,
    segment 0) carry no loss weight, so the padded batch gives the same update.
    """
    rows = next(iter(batch.values())).shape[0]
    extra = -rows % num_shards
    out = {}
    for key, value in batch.items():
        value = np.asarray(value)
        if extra:
            fill = pad_id if key in ("src", "tgt_in", "tgt_out") else 0
            value = np.concatenate([value, np.full((extra,) + value.shape[1:], fill, value.dtype)])
        out[key] = value.reshape((num_shards, -1) + value.shape[1:])
    return out


class DataParallel:
    """The train/eval steps of ``steps`` compiled for data parallelism.

    ``kind='pmap'`` maps over a leading device axis; ``kind='shard_map'`` jits a
    ``shard_map`` over a 1-D mesh named ``'batch'``. Host-side arrays go in through
    ``replicate`` / ``put_batch``; metrics come back as global sums.
    """

    def __init__(
        self,
        kind: str,
        model: nn.Module,
        label_smoothing: float,
        devices: list[jax.Device] | None = None,
        label_smoothing_convention: str = "t2t",
    ) -> None:
        check_kind(kind)
        if kind == "mesh":
            raise ValueError(
                "train.parallel='mesh' is training.mesh.MeshParallel, not DataParallel"
            )
        self.kind = kind
        self.pad_id = model.config.pad_id
        # pmap maps over the local devices; the shard_map mesh spans all processes' devices
        self.devices = list(devices) if devices is not None else None
        local = self.devices if devices is not None else jax.local_devices()
        self.local_devices = local
        self.num_devices = len(local)
        # a leading axis of one entry per local device (pmap's inputs and outputs)
        self.local_sharding = NamedSharding(Mesh(np.array(local), (AXIS,)), P(AXIS))
        kw = dict(
            model=model,
            label_smoothing=label_smoothing,
            label_smoothing_convention=label_smoothing_convention,
            axis_name=AXIS,
        )
        train = functools.partial(steps.train_step, **kw)
        accumulate = functools.partial(steps.accumulate_gradients, **kw)
        evaluate = functools.partial(steps.eval_step, **kw)

        def apply(state: TrainState, accumulated: Any) -> tuple[TrainState, dict]:
            return steps.apply_gradients(state, *accumulated, axis_name=AXIS)

        if kind == "pmap":
            pmap = functools.partial(jax.pmap, axis_name=AXIS, devices=self.devices)
            self._train = pmap(train, donate_argnums=(0,))
            self._accumulate = pmap(accumulate, in_axes=(0, 0, 0, None), donate_argnums=(0,))
            self._apply = pmap(apply, donate_argnums=(0,))
            self._eval = pmap(evaluate)
        else:
            self.mesh = Mesh(np.array(self.devices or jax.devices()), (AXIS,))
            smap = functools.partial(jax.shard_map, mesh=self.mesh, check_vma=False)
            self._train = jax.jit(
                smap(train, in_specs=(P(), P(AXIS)), out_specs=(P(), P())),
                donate_argnums=(0,),
            )
            self._accumulate = jax.jit(
                smap(
                    _squeezed(accumulate, 0),
                    in_specs=(P(AXIS), P(), P(AXIS), P()),
                    out_specs=P(AXIS),
                ),
                donate_argnums=(0,),
            )
            self._apply = jax.jit(
                smap(_squeezed(apply, 1), in_specs=(P(), P(AXIS)), out_specs=(P(), P())),
                donate_argnums=(0,),
            )
            self._eval = jax.jit(smap(evaluate, in_specs=(P(), P(AXIS)), out_specs=P()))

    # -- moving data to and from the devices ------------------------------------------
    def replicate(self, tree: Any) -> Any:
        """Copy a host pytree (e.g. the train state) to every device."""
        if self.kind == "pmap":  # laid out as pmap's outputs, so step 2 does not recompile
            n = self.num_devices
            stacked = jax.tree.map(lambda x: np.broadcast_to(x, (n,) + np.shape(x)), tree)
            return jax.device_put(stacked, self.local_sharding)
        return jax.device_put(tree, NamedSharding(self.mesh, P()))

    def unreplicate(self, tree: Any) -> Any:
        """One copy of a replicated pytree, as host numpy arrays."""
        if self.kind == "pmap":
            tree = jax.tree.map(lambda x: x[0], tree)
        return jax.device_get(tree)

    def local_copies(self, tree: Any) -> list[Any]:
        """A replicated pytree as one single-device pytree per local device, in order."""

        def copy(x: jax.Array, i: int) -> jax.Array:
            shard = next(s.data for s in x.addressable_shards if s.device == local[i])
            return shard[0] if self.kind == "pmap" else shard

        local = self.local_devices
        return [jax.tree.map(lambda x, i=i: copy(x, i), tree) for i in range(len(local))]

    def put_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Split this process's batch over its local devices (device arrays, placed as the
        steps take them; the steps also take host batches and place them first)."""
        shards = shard_batch(batch, self.num_devices, self.pad_id)
        if self.kind == "pmap":
            return jax.device_put(shards, self.local_sharding)
        flat = {k: v.reshape((-1,) + v.shape[2:]) for k, v in shards.items()}
        sharding = NamedSharding(self.mesh, P(AXIS))
        return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in flat.items()}

    def _placed(self, batch: dict) -> dict[str, jax.Array]:
        placed = all(isinstance(v, jax.Array) for v in batch.values())
        return batch if placed else self.put_batch(batch)

    def _metrics(self, metrics: dict) -> dict:
        return jax.tree.map(lambda x: x[0], metrics) if self.kind == "pmap" else metrics

    # -- the compiled steps ----------------------------------------------------------
    def train_step(self, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        """One update on a batch, host arrays or ``put_batch``'s (dropout key:
        ``steps.dropout_key(state)``); returns the new state and global metric sums."""
        state, metrics = self._train(state, self._placed(batch))
        return state, self._metrics(metrics)

    def zero_accumulator(self, state: TrainState) -> Any:
        params = self.unreplicate(state.params) if self.kind == "pmap" else state.params
        zeros = steps.zero_accumulator(params)
        if self.kind == "pmap":
            return self.replicate(zeros)
        sharding = NamedSharding(self.mesh, P(AXIS))
        n = len(self.mesh.devices)
        return jax.tree.map(
            lambda x: jax.device_put(jnp.zeros((n,) + x.shape, x.dtype), sharding), zeros
        )

    def accumulate(self, accumulated: Any, state: TrainState, batch: dict, micro_step: int) -> Any:
        """Add micro-batch ``micro_step``'s gradient sums to the per-device buffers."""
        micro = np.int32(micro_step)
        return self._accumulate(accumulated, state, self._placed(batch), micro)

    def apply(self, state: TrainState, accumulated: Any) -> tuple[TrainState, dict]:
        """The update from accumulated gradients; returns the state and metric sums."""
        state, metrics = self._apply(state, accumulated)
        return state, self._metrics(metrics)

    def eval_step(self, params: Any, batch: dict) -> dict:
        """Global metric sums of one evaluation batch."""
        return self._metrics(self._eval(params, self._placed(batch)))


def _squeezed(fn: Any, argnum: int) -> Any:
    """Under shard_map, drop/restore the leading size-1 device axis of argument ``argnum``."""

    def wrapped(*args: Any) -> Any:
        args = list(args)
        args[argnum] = jax.tree.map(lambda x: x[0], args[argnum])
        out = fn(*args)
        return jax.tree.map(lambda x: x[None], out) if argnum == 0 else out

    return wrapped
