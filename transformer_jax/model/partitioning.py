"""Logical axis names of the parameters and activations, for sharding over a device mesh.

Every parameter's initializer is wrapped by :func:`logical` with the names of its axes:

* ``vocab``: the embedding rows and the logits; ``embed``: d_model; ``mlp``: d_ff;
* ``heads`` and ``kv``: the attention projections' heads and per-head width (d_k, d_v);
* ``length``: the learned position table's rows; ``layers``: the leading axis of a stack's
  parameters under ``scan_layers``.

The names ride on the parameters: ``init`` returns ``nn.LogicallyPartitioned`` boxes
(:class:`Logical`); ``nn.unbox`` gives the plain arrays and ``apply`` takes either. The train
state is made unboxed (``training.run``), so checkpoints hold plain arrays.
Activations are constrained with :func:`constrain` (``activation_*`` names), a no-op unless
a mesh and ``nn.logical_axis_rules`` are active. ``training.mesh`` maps the names onto mesh
axes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax

Array = jax.Array
Initializer = Callable[..., Array]

LAYERS = "layers"  # the scanned layer axis (nn.scan's metadata_params)
ACTIVATIONS = ("activation_batch", "activation_length", "activation_embed")


class Logical(nn.LogicallyPartitioned):
    """A parameter with its logical axis names (``nn.LogicallyPartitioned``) that unboxes to
    its value unconstrained: ``nn.DenseGeneral`` unboxes its kernel at its flattened rank,
    which the names do not fit, when ``apply`` checks shapes under a mesh."""

    def unbox(self, apply_constraint: bool = True) -> Any:
        return self.value


def logical(init: Initializer, names: Sequence[str | None]) -> Initializer:
    """``init`` whose value carries the logical axis ``names`` in a :class:`Logical` box
    (as ``nn.with_logical_partitioning`` makes a ``LogicallyPartitioned`` one)."""
    names = tuple(names)

    @functools.wraps(init)
    def initializer(*args: Any, **kwargs: Any) -> Logical:
        return Logical(init(*args, **kwargs), names)

    return initializer


def logical_specs(init: Callable[[], Any]) -> Any:
    """The logical ``PartitionSpec`` of each parameter ``init()`` makes, e.g.
    ``logical_specs(lambda: model.init(key, src, tgt)['params'])``; only shapes are computed."""
    return nn.get_partition_spec(jax.eval_shape(init))


def constrain(x: Array, names: Sequence[str | None] = ACTIVATIONS) -> Array:
    """``x`` sharded as its logical axis ``names`` say under the active rules and mesh
    (``nn.with_logical_constraint``; a no-op without a mesh)."""
    return nn.with_logical_constraint(x, tuple(names))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def gathered(x: Array, whole: tuple[str | None, ...]) -> Array:
    """A parameter ``x`` constrained to the logical names ``whole`` (its own with the axes
    to gather set to ``None``): FSDP's all-gather, once for all its uses. The gradient is
    left unconstrained, for the partitioner to sum into the parameter's shards (the same
    constraint on it would all-reduce the whole)."""
    return constrain(x, whole)


def _gathered_fwd(x: Array, whole: tuple) -> tuple[Array, None]:
    return gathered(x, whole), None


def _gathered_bwd(whole: tuple, _: None, g: Array) -> tuple[Array]:
    return (g,)


gathered.defvjp(_gathered_fwd, _gathered_bwd)
