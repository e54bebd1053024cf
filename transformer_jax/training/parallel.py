"""One protocol for the parallel strategies: :class:`Parallel`, and its data-parallel kinds.

Every strategy compiles the per-device functions of ``steps`` and moves host arrays to and
from its devices; the loop, evaluation, ``aot`` and the benchmarks use only :class:`Parallel`'s
methods and its public compiled steps (``train_fn``, ``accumulate_fn``, ``apply_fn``,
``eval_fn``, and :meth:`Parallel.step_program` with their abstract inputs).

Data parallelism (:class:`PmapParallel`, :class:`ShardMapParallel`) maps the steps over the
device axis ``'batch'``: each device computes gradients on its slice of the global batch,
gradients and metric sums are summed with ``lax.psum`` and divided by the global token
count, so any number of devices performs the same update. The train state is replicated and
donated; gradient-accumulation buffers stay per device (leading device axis) until the
update. ``training.mesh.MeshParallel`` shards the state over a 2-D mesh;
``training.mesh.make_parallel`` builds the strategy ``train.parallel`` names.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Any, ClassVar

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
BATCH_KEYS = ("src", "tgt_in", "tgt_out")


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
            fill = pad_id if key in BATCH_KEYS else 0
            value = np.concatenate([value, np.full((extra,) + value.shape[1:], fill, value.dtype)])
        out[key] = value.reshape((num_shards, -1) + value.shape[1:])
    return out


def spec(shape: tuple[int, ...], dtype: Any, sharding: Any = None) -> jax.ShapeDtypeStruct:
    """An abstract argument: shape, dtype and (optionally) its placement."""
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


@dataclasses.dataclass(frozen=True)
class Program:
    """A compiled step and abstract arguments placed as the run places them:
    ``fn.lower(*args).compile()`` compiles the program the run executes."""

    fn: Any
    args: tuple


class Parallel(abc.ABC):
    """The train/eval steps of ``steps`` compiled for a set of devices.

    Host arrays go in through :meth:`replicate` / :meth:`put_batch` (the steps also take
    host batches and place them first); metrics come back as global sums. Subclasses set
    the compiled steps ``train_fn(state, batch)``, ``accumulate_fn(accumulated, state,
    batch, micro)``, ``apply_fn(state, accumulated)`` and ``eval_fn(params, batch)``.
    """

    kind: ClassVar[str]
    local_devices: list[jax.Device]  # this process's devices, in order
    num_devices: int  # len(local_devices)
    train_fn: Any
    accumulate_fn: Any
    apply_fn: Any
    eval_fn: Any

    def __init__(self, model: nn.Module, label_smoothing: float, convention: str) -> None:
        self.pad_id = model.config.pad_id
        self.step_options = dict(
            model=model, label_smoothing=label_smoothing, label_smoothing_convention=convention
        )

    # -- moving data to and from the devices ------------------------------------------
    @abc.abstractmethod
    def replicate(self, tree: Any) -> Any:
        """Place a host pytree (the train state, parameters) on the devices."""

    @abc.abstractmethod
    def unreplicate(self, tree: Any) -> Any:
        """One whole copy of a placed pytree, as host numpy arrays."""

    @abc.abstractmethod
    def local_copies(self, tree: Any) -> list[Any]:
        """A placed pytree as one whole single-device pytree per local device, in order."""

    @abc.abstractmethod
    def put_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """This process's batch on its local devices, placed as the steps take it."""

    @abc.abstractmethod
    def zero_accumulator(self, state: TrainState) -> Any:
        """Empty gradient and metric sums for :meth:`accumulate`, placed."""

    # -- the abstract inputs of the compiled steps ------------------------------------
    @abc.abstractmethod
    def state_specs(self, state: Any) -> Any:
        """The abstract train state ``state`` (shapes) as ``train_fn`` takes it."""

    @abc.abstractmethod
    def batch_specs(self, rows: int, length: int) -> dict[str, jax.ShapeDtypeStruct]:
        """A global batch of ``rows`` x ``length`` tokens as ``train_fn`` takes it."""

    @abc.abstractmethod
    def accumulator_specs(self, state: Any) -> Any:
        """:meth:`zero_accumulator`'s output for the abstract ``state``, abstract."""

    def step_program(
        self, state: Any, rows: int, length: int, grad_accum_steps: int = 1
    ) -> Program:
        """The step the run executes for the abstract ``state`` and a global batch of
        ``rows`` x ``length``: ``train_fn``, or with ``grad_accum_steps > 1`` one
        micro-batch's ``accumulate_fn``."""
        placed, batch = self.state_specs(state), self.batch_specs(rows, length)
        if grad_accum_steps > 1:
            accumulated = self.accumulator_specs(state)
            return Program(self.accumulate_fn, (accumulated, placed, batch, np.int32(0)))
        return Program(self.train_fn, (placed, batch))

    # -- the steps ----------------------------------------------------------------------
    def placed(self, batch: dict) -> dict[str, jax.Array]:
        """``batch`` as the steps take it (``put_batch`` unless already on the devices)."""
        done = all(isinstance(v, jax.Array) for v in batch.values())
        return batch if done else self.put_batch(batch)

    def global_metrics(self, metrics: dict) -> dict:
        """The global sums of a step's metrics output."""
        return metrics

    def train_step(self, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        """One update on a batch, host arrays or ``put_batch``'s (dropout key:
        ``steps.dropout_key(state)``); returns the new state and global metric sums."""
        state, metrics = self.train_fn(state, self.placed(batch))
        return state, self.global_metrics(metrics)

    def accumulate(self, accumulated: Any, state: TrainState, batch: dict, micro_step: int) -> Any:
        """Add micro-batch ``micro_step``'s gradient and metric sums to ``accumulated``."""
        return self.accumulate_fn(accumulated, state, self.placed(batch), np.int32(micro_step))

    def apply(self, state: TrainState, accumulated: Any) -> tuple[TrainState, dict]:
        """The update from accumulated gradients; returns the state and metric sums."""
        state, metrics = self.apply_fn(state, accumulated)
        return state, self.global_metrics(metrics)

    def eval_step(self, params: Any, batch: dict) -> dict:
        """Global metric sums of one evaluation batch."""
        return self.global_metrics(self.eval_fn(params, self.placed(batch)))


class DataParallel(Parallel):
    """Replicated state, the batch split over the device axis ``'batch'`` (the steps sum
    over it); ``devices``: the devices to use (default: all)."""

    def __init__(
        self,
        model: nn.Module,
        label_smoothing: float,
        devices: list[jax.Device] | None = None,
        label_smoothing_convention: str = "t2t",
    ) -> None:
        super().__init__(model, label_smoothing, label_smoothing_convention)
        self.devices = list(devices) if devices is not None else None
        local = self.devices if devices is not None else jax.local_devices()
        self.local_devices = local
        self.num_devices = len(local)
        # a leading axis of one entry per local device (pmap's inputs and outputs)
        self.local_sharding = NamedSharding(Mesh(np.array(local), (AXIS,)), P(AXIS))
        kw = dict(self.step_options, axis_name=AXIS)
        self.compile(
            train=functools.partial(steps.train_step, **kw),
            accumulate=functools.partial(steps.accumulate_gradients, **kw),
            apply=lambda state, acc: steps.apply_gradients(state, *acc, axis_name=AXIS),
            evaluate=functools.partial(steps.eval_step, **kw),
        )

    @abc.abstractmethod
    def compile(self, *, train: Any, accumulate: Any, apply: Any, evaluate: Any) -> None:
        """Set the compiled steps from the per-device functions."""

    def accumulator_shapes(self, params: Any) -> Any:
        """One device's accumulation buffers, abstract."""
        return jax.eval_shape(steps.zero_accumulator, params)


class PmapParallel(DataParallel):
    """``jax.pmap`` over a leading device axis of the local devices."""

    kind = "pmap"

    def compile(self, *, train: Any, accumulate: Any, apply: Any, evaluate: Any) -> None:
        pmap = functools.partial(jax.pmap, axis_name=AXIS, devices=self.devices)
        self.train_fn = pmap(train, donate_argnums=(0,))
        self.accumulate_fn = pmap(accumulate, in_axes=(0, 0, 0, None), donate_argnums=(0,))
        self.apply_fn = pmap(apply, donate_argnums=(0,))
        self.eval_fn = pmap(evaluate)

    def replicate(self, tree: Any) -> Any:
        """Copy a host pytree (e.g. the train state) to every device, laid out as pmap's
        outputs (so step 2 does not recompile)."""
        n = self.num_devices
        stacked = jax.tree.map(lambda x: np.broadcast_to(x, (n,) + np.shape(x)), tree)
        return jax.device_put(stacked, self.local_sharding)

    def unreplicate(self, tree: Any) -> Any:
        return jax.device_get(jax.tree.map(lambda x: x[0], tree))

    def local_copies(self, tree: Any) -> list[Any]:
        def copy(x: jax.Array, device: jax.Device) -> jax.Array:
            return next(s.data for s in x.addressable_shards if s.device == device)[0]

        return [jax.tree.map(lambda x, d=d: copy(x, d), tree) for d in self.local_devices]

    def put_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        shards = shard_batch(batch, self.num_devices, self.pad_id)
        return jax.device_put(shards, self.local_sharding)

    def global_metrics(self, metrics: dict) -> dict:
        return jax.tree.map(lambda x: x[0], metrics)

    def zero_accumulator(self, state: TrainState) -> Any:
        return self.replicate(steps.zero_accumulator(self.unreplicate(state.params)))

    def stacked(self, tree: Any) -> Any:
        """``tree`` with a leading device axis, one entry on each device."""
        n = self.num_devices
        return jax.tree.map(lambda x: spec((n, *x.shape), x.dtype, self.local_sharding), tree)

    def state_specs(self, state: Any) -> Any:
        return self.stacked(state)

    def batch_specs(self, rows: int, length: int) -> dict[str, jax.ShapeDtypeStruct]:
        n = self.num_devices
        return {k: spec((n, rows // n, length), jnp.int32, self.local_sharding) for k in BATCH_KEYS}

    def accumulator_specs(self, state: Any) -> Any:
        return self.stacked(self.accumulator_shapes(state.params))


class ShardMapParallel(DataParallel):
    """``jax.jit`` over ``jax.shard_map`` on a 1-D mesh ``'batch'`` of all processes'
    devices (or ``devices``)."""

    kind = "shard_map"

    def compile(self, *, train: Any, accumulate: Any, apply: Any, evaluate: Any) -> None:
        self.mesh = Mesh(np.array(self.devices or jax.devices()), (AXIS,))
        self.replicated = NamedSharding(self.mesh, P())
        self.split = NamedSharding(self.mesh, P(AXIS))
        smap = functools.partial(jax.shard_map, mesh=self.mesh, check_vma=False)
        self.train_fn = jax.jit(
            smap(train, in_specs=(P(), P(AXIS)), out_specs=(P(), P())), donate_argnums=(0,)
        )
        self.accumulate_fn = jax.jit(
            smap(
                _squeezed(accumulate, 0),
                in_specs=(P(AXIS), P(), P(AXIS), P()),
                out_specs=P(AXIS),
            ),
            donate_argnums=(0,),
        )
        self.apply_fn = jax.jit(
            smap(_squeezed(apply, 1), in_specs=(P(), P(AXIS)), out_specs=(P(), P())),
            donate_argnums=(0,),
        )
        self.eval_fn = jax.jit(smap(evaluate, in_specs=(P(), P(AXIS)), out_specs=P()))

    def replicate(self, tree: Any) -> Any:
        return jax.device_put(tree, self.replicated)

    def unreplicate(self, tree: Any) -> Any:
        return jax.device_get(tree)

    def local_copies(self, tree: Any) -> list[Any]:
        def copy(x: jax.Array, device: jax.Device) -> jax.Array:
            return next(s.data for s in x.addressable_shards if s.device == device)

        return [jax.tree.map(lambda x, d=d: copy(x, d), tree) for d in self.local_devices]

    def put_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        shards = shard_batch(batch, self.num_devices, self.pad_id)
        flat = {k: v.reshape((-1,) + v.shape[2:]) for k, v in shards.items()}
        return {k: jax.make_array_from_process_local_data(self.split, v) for k, v in flat.items()}

    def zero_accumulator(self, state: TrainState) -> Any:
        n = len(self.mesh.devices)
        zeros = self.accumulator_shapes(state.params)
        return jax.tree.map(
            lambda x: jax.device_put(jnp.zeros((n,) + x.shape, x.dtype), self.split), zeros
        )

    def state_specs(self, state: Any) -> Any:
        return jax.tree.map(lambda x: spec(x.shape, x.dtype, self.replicated), state)

    def batch_specs(self, rows: int, length: int) -> dict[str, jax.ShapeDtypeStruct]:
        return {k: spec((rows, length), jnp.int32, self.split) for k in BATCH_KEYS}

    def accumulator_specs(self, state: Any) -> Any:
        n = len(self.mesh.devices)
        buffers = self.accumulator_shapes(state.params)
        return jax.tree.map(lambda x: spec((n, *x.shape), x.dtype, self.split), buffers)


def _squeezed(fn: Any, argnum: int) -> Any:
    """Under shard_map, drop/restore the leading size-1 device axis of argument ``argnum``."""

    def wrapped(*args: Any) -> Any:
        args = list(args)
        args[argnum] = jax.tree.map(lambda x: x[0], args[argnum])
        out = fn(*args)
        return jax.tree.map(lambda x: x[None], out) if argnum == 0 else out

    return wrapped
