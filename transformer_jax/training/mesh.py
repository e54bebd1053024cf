"""Training over a 2-D device mesh ``('data', 'model')``: one ``jax.jit`` with ``NamedSharding``.

Every leaf of the train state is placed by Flax's logical partitioning: the parameters carry
their logical axis names (:mod:`transformer_jax.model.partitioning`), Adam's moments and the
gradient buffers inherit them (``tree_map`` keeps the boxes), and
``nn.logical_to_mesh_sharding`` of the boxed abstract state under ``train.logical_axis_rules``
gives each leaf's sharding (by default FSDP-style ``embed`` over ``'data'``, tensor-parallel
``heads``, ``mlp`` and ``vocab`` over ``'model'``); an axis whose size does not divide its mesh
axis stays whole. The batch rows are split over ``'data'``. The steps are ``steps``'
functions on the global batch (no device axis): XLA inserts the collectives, and the update
is the one data parallelism computes. One dropout key serves the global batch, so with
dropout the masks differ from pmap's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer_jax.training import steps
from transformer_jax.training.config import DEFAULT_RULES, MESH_AXES, TrainConfig, parse_rules
from transformer_jax.training.parallel import (
    BATCH_KEYS,
    Parallel,
    PmapParallel,
    ShardMapParallel,
    check_kind,
    shard_batch,
    spec,
)
from transformer_jax.training.steps import TrainState

RULES = parse_rules(DEFAULT_RULES)  # train.logical_axis_rules' default


def mesh_shape(num_devices: int, model_size: int) -> tuple[int, int]:
    """``(data, model)`` sizes for ``num_devices`` with a model axis of ``model_size``."""
    if model_size < 1 or num_devices % model_size:
        raise ValueError(
            f"train.mesh_model={model_size} must divide the {num_devices} devices "
            "(the data axis is devices / mesh_model)"
        )
    return num_devices // model_size, model_size


class MeshParallel(Parallel):
    """The train/eval steps of ``steps`` jitted over a ``('data', 'model')`` mesh.

    ``model``: an encoder-decoder module, ``model.init(key, src, tgt_in)`` (its boxed
    abstract parameters give the logical names); ``model_size``: the size of the ``'model'``
    axis (tensor parallelism), the ``'data'`` axis takes the other devices; ``rules``:
    ``(logical, mesh axis)`` pairs (``train.logical_axis_rules``). Host arrays go in through
    ``replicate`` (placed sharded) and ``put_batch``.
    """

    kind = "mesh"

    def __init__(
        self,
        model: nn.Module,
        label_smoothing: float,
        devices: list[jax.Device] | None = None,
        label_smoothing_convention: str = "t2t",
        model_size: int = 1,
        rules: Sequence[tuple[str, str]] = RULES,
    ) -> None:
        super().__init__(model, label_smoothing, label_smoothing_convention)
        devices = list(devices) if devices is not None else jax.devices()
        shape = mesh_shape(len(devices), model_size)
        self.mesh = Mesh(np.array(devices).reshape(shape), MESH_AXES)
        self.rules = tuple(map(tuple, rules))
        self.local_devices = [d for d in devices if d.process_index == jax.process_index()]
        self.num_devices = len(self.local_devices)
        rows = [r for r in self.mesh.devices if any(d in self.local_devices for d in r)]
        self.local_data = len(rows)  # the data shards this process feeds
        self.split = NamedSharding(self.mesh, P("data"))
        tokens = jnp.zeros((1, 8), jnp.int32)
        # the parameters' shapes in their LogicallyPartitioned boxes
        self.boxed_params = jax.eval_shape(
            lambda: model.init(jax.random.key(0), tokens, tokens)["params"]
        )
        self.accumulator_shardings = self.shardings(
            jax.eval_shape(steps.zero_accumulator, self.boxed_params)
        )
        kw = self.step_options
        placed = self.state_shardings

        def train(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
            state, metrics = steps.train_step(state, batch, **kw)
            return jax.lax.with_sharding_constraint(state, placed(state)), metrics

        def accumulate(accumulated: Any, state: TrainState, batch: dict, micro: Any) -> Any:
            out = steps.accumulate_gradients(accumulated, state, batch, micro, **kw)
            return jax.lax.with_sharding_constraint(out, self.accumulator_shardings)

        def apply(state: TrainState, accumulated: Any) -> tuple[TrainState, dict]:
            state, metrics = steps.apply_gradients(state, *accumulated)
            return jax.lax.with_sharding_constraint(state, placed(state)), metrics

        self.train_fn = self._jit(train, donate_argnums=(0,))
        self.accumulate_fn = self._jit(accumulate, donate_argnums=(0,))
        self.apply_fn = self._jit(apply, donate_argnums=(0,))
        self.eval_fn = self._jit(functools.partial(steps.eval_step, **kw))
        self._zeros = self._jit(steps.zero_accumulator, out_shardings=self.accumulator_shardings)

    def _jit(self, fn: Callable, **kwargs: Any) -> OnMesh:
        return OnMesh(jax.jit(fn, **kwargs), self.mesh, self.rules)

    # -- placement --------------------------------------------------------------------
    def shardings(self, boxed: Any) -> Any:
        """A ``NamedSharding`` per leaf of the boxed abstract pytree ``boxed``:
        ``nn.logical_to_mesh_sharding`` of its logical specs under the rules (unboxed
        leaves replicated), an axis that its mesh axes do not divide left whole."""
        named = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), self.mesh, self.rules)
        return jax.tree.map(self._fitted, nn.unbox(boxed), named)

    def _fitted(self, leaf: Any, sharding: NamedSharding) -> NamedSharding:
        shape = np.shape(leaf)
        axes = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))

        def size(axis: Any) -> int:
            names = axis if isinstance(axis, tuple) else (axis,)
            return math.prod(self.mesh.shape[a] for a in names)

        pairs = zip(axes, shape, strict=True)
        fitted = [a if a is None or n % size(a) == 0 else None for a, n in pairs]
        return NamedSharding(self.mesh, P(*fitted))

    def boxed_state(self, state: Any) -> Any:
        """The boxed abstract train state with ``state``'s optimizer: an ``eval_shape`` of
        ``create_train_state`` on the model's boxed parameters."""
        rng = jax.ShapeDtypeStruct(np.shape(state.rng), state.rng.dtype)
        make = lambda rng: steps.create_train_state(self.boxed_params, state.tx, rng)  # noqa: E731
        return jax.eval_shape(make, rng)

    def state_shardings(self, state: Any) -> Any:
        """Each leaf's sharding of a train state (parameters, Adam moments, step, key)."""
        return self.shardings(self.boxed_state(state))

    def placement(self, tree: Any) -> Any:
        """The shardings of a train state or of the parameters."""
        if isinstance(tree, TrainState):
            return self.state_shardings(tree)
        return self.shardings(self.boxed_params)

    def replicate(self, tree: Any) -> Any:
        """Place a host pytree (the train state, parameters) on the mesh, sharded."""
        return jax.device_put(tree, self.placement(tree))

    def unreplicate(self, tree: Any) -> Any:
        """The whole of a placed pytree as host numpy arrays (gathered from the shards)."""
        if jax.process_count() == 1:
            return jax.device_get(tree)
        return multihost_utils.process_allgather(tree, tiled=True)

    def local_copies(self, tree: Any) -> list[Any]:
        """The whole pytree once on each local device, in order (for decoding)."""
        host = self.unreplicate(tree)
        return [jax.device_put(host, d) for d in self.local_devices]

    def put_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """This process's batch, padded with empty rows to split evenly, rows over ``'data'``."""
        shards = shard_batch(batch, self.local_data, self.pad_id)
        return {
            k: jax.make_array_from_process_local_data(self.split, v.reshape((-1,) + v.shape[2:]))
            for k, v in shards.items()
        }

    def zero_accumulator(self, state: TrainState) -> Any:
        """Empty gradient sums, sharded as the parameters, and metric sums."""
        return self._zeros(state.params)

    # -- abstract inputs ----------------------------------------------------------------
    def state_specs(self, state: Any) -> Any:
        return jax.tree.map(
            lambda x, s: spec(x.shape, x.dtype, s), state, self.state_shardings(state)
        )

    def batch_specs(self, rows: int, length: int) -> dict[str, jax.ShapeDtypeStruct]:
        return {k: spec((rows, length), jnp.int32, self.split) for k in BATCH_KEYS}

    def accumulator_specs(self, state: Any) -> Any:
        shapes = jax.eval_shape(steps.zero_accumulator, state.params)
        return jax.tree.map(
            lambda x, s: spec(x.shape, x.dtype, s), shapes, self.accumulator_shardings
        )


class OnMesh:
    """A jitted function traced, run and lowered with its mesh and logical axis rules
    active (they give the activations' ``with_logical_constraint`` its mesh axes)."""

    def __init__(self, jitted: Any, mesh: Mesh, rules: tuple) -> None:
        self.jitted, self.mesh, self.rules = jitted, mesh, rules

    def __call__(self, *args: Any) -> Any:
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            return self.jitted(*args)

    def lower(self, *args: Any) -> Any:
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            return self.jitted.lower(*args)


STRATEGIES = {"pmap": PmapParallel, "shard_map": ShardMapParallel}


def make_parallel(
    kind: str,
    model: nn.Module,
    label_smoothing: float,
    *,
    label_smoothing_convention: str = "t2t",
    mesh_model: int = 1,
    logical_axis_rules: str = DEFAULT_RULES,
    devices: list[jax.Device] | None = None,
) -> Parallel:
    """``train.parallel``'s strategy on ``devices`` (default: all): :class:`MeshParallel` for
    ``'mesh'`` (a model axis of ``mesh_model`` devices, ``train.logical_axis_rules``), else
    :class:`~transformer_jax.training.parallel.PmapParallel` or ``ShardMapParallel``."""
    check_kind(kind)
    if kind == "mesh":
        return MeshParallel(
            model,
            label_smoothing,
            devices=devices,
            label_smoothing_convention=label_smoothing_convention,
            model_size=mesh_model,
            rules=parse_rules(logical_axis_rules),
        )
    strategy = STRATEGIES[kind]
    return strategy(model, label_smoothing, devices, label_smoothing_convention)


def run_parallel(
    train: TrainConfig, model: nn.Module, devices: list[jax.Device] | None = None
) -> Parallel:
    """The strategy a run's ``train`` section names, with its loss and mesh settings, as
    ``train.py`` makes it (:func:`make_parallel`)."""
    return make_parallel(
        train.parallel,
        model,
        train.label_smoothing,
        label_smoothing_convention=train.label_smoothing_convention,
        mesh_model=train.mesh_model,
        logical_axis_rules=train.logical_axis_rules,
        devices=devices,
    )
