"""Training over a 2-D device mesh ``('data', 'model')``: one ``jax.jit`` with ``NamedSharding``.

Each array is placed by the logical axis names of its parameter
(:mod:`transformer_jax.model.partitioning`) under :data:`RULES`: FSDP-style, parameters,
Adam moments and gradient buffers are split over ``'data'`` on their ``embed`` axis; tensor
parallel, ``heads``, ``mlp`` and ``vocab`` are split over ``'model'``. The batch rows are
split over ``'data'``. The steps are ``steps``' functions on the global batch (no device
axis): XLA inserts the collectives, and the update is the one :class:`DataParallel` computes.
One dropout key serves the global batch, so with dropout the masks differ from pmap's.

:class:`MeshParallel` has :class:`~transformer_jax.training.parallel.DataParallel`'s
interface, so the loop, evaluation and checkpoints use it unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer_jax.model.partitioning import logical_specs
from transformer_jax.training import steps
from transformer_jax.training.parallel import DataParallel, check_kind, shard_batch
from transformer_jax.training.steps import TrainState

MESH_AXES = ("data", "model")
# logical axis -> mesh axis; names not listed (kv, length, layers, ...) stay whole
RULES = (
    ("embed", "data"),
    ("vocab", "model"),
    ("heads", "model"),
    ("mlp", "model"),
    ("activation_batch", "data"),
    ("activation_vocab", "model"),
)


def mesh_shape(num_devices: int, model_size: int) -> tuple[int, int]:
    """``(data, model)`` sizes for ``num_devices`` with a model axis of ``model_size``."""
    if model_size < 1 or num_devices % model_size:
        raise ValueError(
            f"train.mesh_model={model_size} must divide the {num_devices} devices "
            "(the data axis is devices / mesh_model)"
        )
    return num_devices // model_size, model_size


class MeshParallel:
    """The train/eval steps of ``steps`` jitted over a ``('data', 'model')`` mesh.

    ``model``: an encoder-decoder module, ``model.init(key, src, tgt_in)`` (its parameters'
    logical names are read from an abstract ``init``); ``model_size``: the size of the
    ``'model'`` axis (tensor parallelism); the ``'data'`` axis takes the other devices.
    Host arrays go in through ``replicate`` (placed sharded, the name kept from
    :class:`DataParallel`) and ``put_batch``.
    """

    kind = "mesh"

    def __init__(
        self,
        model: nn.Module,
        label_smoothing: float,
        devices: list[jax.Device] | None = None,
        label_smoothing_convention: str = "t2t",
        model_size: int = 1,
    ) -> None:
        self.pad_id = model.config.pad_id
        devices = list(devices) if devices is not None else jax.devices()
        shape = mesh_shape(len(devices), model_size)
        self.mesh = Mesh(np.array(devices).reshape(shape), MESH_AXES)
        self.local_devices = [d for d in devices if d.process_index == jax.process_index()]
        self.num_devices = len(self.local_devices)
        rows = [r for r in self.mesh.devices if any(d in self.local_devices for d in r)]
        self.local_data = len(rows)  # the data shards this process feeds
        self._specs = _param_specs(model, self.mesh)
        kw = dict(
            model=model,
            label_smoothing=label_smoothing,
            label_smoothing_convention=label_smoothing_convention,
        )
        constrain = self._constrain

        def train(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
            state, metrics = steps.train_step(state, batch, **kw)
            return constrain(state), metrics

        def accumulate(accumulated: Any, state: TrainState, batch: dict, micro: Any) -> Any:
            return constrain(steps.accumulate_gradients(accumulated, state, batch, micro, **kw))

        def apply(state: TrainState, accumulated: Any) -> tuple[TrainState, dict]:
            state, metrics = steps.apply_gradients(state, *accumulated)
            return constrain(state), metrics

        self._train = self._jit(train, donate_argnums=(0,))
        self._accumulate = self._jit(accumulate, donate_argnums=(0,))
        self._apply = self._jit(apply, donate_argnums=(0,))
        self._zeros = self._jit(lambda params: constrain(steps.zero_accumulator(params)))
        self._eval = self._jit(functools.partial(steps.eval_step, **kw))

    def _jit(self, fn: Callable, **kwargs: Any) -> _OnMesh:
        return _OnMesh(jax.jit(fn, **kwargs), self.mesh)

    # -- placement --------------------------------------------------------------------
    def shardings(self, tree: Any) -> Any:
        """A ``NamedSharding`` per leaf of ``tree``: a parameter's, or that of the parameter
        whose path ends the leaf's path with the same shape (Adam moments, gradients);
        other leaves (step, keys, counts, metrics) are replicated."""
        replicated = NamedSharding(self.mesh, P())

        def pick(path: tuple, leaf: Any) -> NamedSharding:
            keys = tuple(map(str, path))
            for start in range(len(keys)):
                found = self._specs.get(keys[start:])
                if found is not None and found[0] == tuple(np.shape(leaf)):
                    return found[1]
            return replicated

        return jax.tree_util.tree_map_with_path(pick, tree)

    def _constrain(self, tree: Any) -> Any:
        return jax.lax.with_sharding_constraint(tree, self.shardings(tree))

    def replicate(self, tree: Any) -> Any:
        """Place a host pytree (the train state, parameters) on the mesh, sharded."""
        return jax.device_put(tree, self.shardings(tree))

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
        sharding = NamedSharding(self.mesh, P("data"))
        return {
            k: jax.make_array_from_process_local_data(sharding, v.reshape((-1,) + v.shape[2:]))
            for k, v in shards.items()
        }

    def _placed(self, batch: dict) -> dict[str, jax.Array]:
        placed = all(isinstance(v, jax.Array) for v in batch.values())
        return batch if placed else self.put_batch(batch)

    # -- the compiled steps ----------------------------------------------------------
    def train_step(self, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        """One update on a global batch; returns the new state and global metric sums."""
        return self._train(state, self._placed(batch))

    def zero_accumulator(self, state: TrainState) -> Any:
        """Empty gradient sums, sharded as the parameters, and metric sums."""
        return self._zeros(state.params)

    def accumulate(self, accumulated: Any, state: TrainState, batch: dict, micro_step: int) -> Any:
        """Add micro-batch ``micro_step``'s gradient and metric sums to ``accumulated``."""
        return self._accumulate(accumulated, state, self._placed(batch), np.int32(micro_step))

    def apply(self, state: TrainState, accumulated: Any) -> tuple[TrainState, dict]:
        """The update from accumulated gradients; returns the state and metric sums."""
        return self._apply(state, accumulated)

    def eval_step(self, params: Any, batch: dict) -> dict:
        """Global metric sums of one evaluation batch."""
        return self._eval(params, self._placed(batch))


class _OnMesh:
    """A jitted function traced, run and lowered with its mesh and :data:`RULES` active
    (they give the activations' ``with_logical_constraint`` its mesh axes)."""

    def __init__(self, jitted: Any, mesh: Mesh) -> None:
        self.jitted, self.mesh = jitted, mesh

    def __call__(self, *args: Any) -> Any:
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(RULES):
            return self.jitted(*args)

    def lower(self, *args: Any) -> Any:
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(RULES):
            return self.jitted.lower(*args)


def _param_specs(model: nn.Module, mesh: Mesh) -> dict[tuple[str, ...], tuple]:
    """Each parameter's path (as strings) -> its shape and ``NamedSharding`` under
    :data:`RULES`; an axis that does not divide by its mesh axis stays whole."""
    tokens = jnp.zeros((1, 8), jnp.int32)
    init = lambda: model.init(jax.random.key(0), tokens, tokens)["params"]  # noqa: E731
    logical = logical_specs(init)
    shapes = jax.eval_shape(init)
    is_spec = lambda x: isinstance(x, P)  # noqa: E731
    out = {}
    for (path, spec), shape in zip(
        jax.tree_util.tree_leaves_with_path(logical, is_leaf=is_spec),
        jax.tree.leaves(shapes),
        strict=True,
    ):
        axes = nn.logical_to_mesh_axes(tuple(spec), RULES)
        fitted = [
            a if a is None or size % mesh.shape[a] == 0 else None
            for a, size in zip(axes, shape.shape, strict=True)
        ]
        out[tuple(map(str, path))] = (shape.shape, NamedSharding(mesh, P(*fitted)))
    return out


def make_parallel(
    kind: str,
    model: nn.Module,
    label_smoothing: float,
    *,
    label_smoothing_convention: str = "t2t",
    mesh_model: int = 1,
) -> DataParallel | MeshParallel:
    """``train.parallel``'s strategy: :class:`MeshParallel` for ``'mesh'`` (model axis of
    ``mesh_model`` devices), else :class:`DataParallel`."""
    check_kind(kind)
    if kind == "mesh":
        return MeshParallel(
            model,
            label_smoothing,
            label_smoothing_convention=label_smoothing_convention,
            model_size=mesh_model,
        )
    return DataParallel(
        kind, model, label_smoothing, label_smoothing_convention=label_smoothing_convention
    )
