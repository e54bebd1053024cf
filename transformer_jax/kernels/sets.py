"""The kernel sets: the products, dropout and LayerNorm the model takes, by name (:func:`ops`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax

from transformer_jax.kernels import dropout, matmul, norm, precision

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Ops:
    """The products, dropout and LayerNorm the model takes from one kernel set.

    ``dot_general(precision)``: a ``lax.dot_general`` for ``nn.Dense(dot_general=...)``;
    ``einsum(spec, a, b, precision, preferred_element_type=None)``;
    ``tied_logits(x, embedding, precision)``: ``x E^T``;
    ``dropout(x, rate, rng)``: §5.4's dropout;
    ``layer_norm(x, scale, bias, epsilon, dtype)``: LayerNorm with its own backward pass, or
    None for flax's ``nn.LayerNorm``.
    """

    name: str
    dot_general: Callable[[str], Callable[..., Array]]
    einsum: Callable[..., Array]
    tied_logits: Callable[[Array, Array, str], Array]
    dropout: Callable[[Array, float, Array], Array]
    layer_norm: Callable[..., Array] | None


def _tied_logits(x: Array, embedding: Array, matmul_precision: str = "float32") -> Array:
    return precision.einsum("...d,vd->...v", x, embedding, matmul_precision)


XLA = Ops(
    "xla",
    precision.dot_general,
    precision.einsum,
    _tied_logits,
    dropout.dropout,
    norm.layer_norm,
)
CPU = Ops("cpu", matmul.dot_general, matmul.einsum, matmul.tied_logits, dropout.fused_dropout, None)
_SETS = {"xla": XLA, "cpu": CPU}


def ops(name: str) -> Ops:
    """The kernel set ``name`` ('xla' | 'cpu', see :func:`transformer_jax.options.resolve`)."""
    if name not in _SETS:
        raise ValueError(f"kernel set must be one of {tuple(_SETS)}, got {name!r}")
    return _SETS[name]
