"""The arithmetic of a matrix product (``TransformerConfig.matmul_precision``).

``'float32'`` is the paper's arithmetic: float32 operands at ``Precision.HIGHEST``, so
that GPUs with TF32 tensor cores (Ampere and later) do not round the operands to 10-bit
mantissas. ``'tf32'`` is the backend's default precision (TF32 on those GPUs, float32 on
CPUs). ``'bfloat16'`` rounds both operands of every product to bfloat16 and accumulates
and returns float32, in the forward pass and in both products of its derivative; what
lies between the products (softmax, LayerNorm, the loss, the Adam update, the parameters)
stays float32. It is a TPU's default matmul arithmetic.

The products themselves come from a kernel set (:mod:`transformer_jax.kernels`): a
``product(spec, a, b, precision)`` without custom derivative, given to :func:`einsum`.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from transformer_jax.options import MATMUL_PRECISIONS

Array = jax.Array
Product = Callable[[str, Array, Array, str], Array]

_LAX = {"float32": jax.lax.Precision.HIGHEST, "tf32": jax.lax.Precision.DEFAULT}


def lax_precision(precision: str) -> jax.lax.Precision:
    """The ``lax`` precision of a float32 product at ``precision`` ('float32' or 'tf32')."""
    return _LAX[precision]


def check(precision: str) -> None:
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul_precision must be one of {MATMUL_PRECISIONS}, got {precision!r}")


def plain_product(spec: str, a: Array, b: Array, precision: str) -> Array:
    """``jnp.einsum(spec, a, b)`` at ``precision``; bfloat16 operands return float32."""
    if precision == "bfloat16":
        return bfloat16_product(spec, a.astype(jnp.bfloat16), b.astype(jnp.bfloat16))
    return jnp.einsum(spec, a, b, precision=lax_precision(precision))


def bfloat16_product(spec: str, a: Array, b: Array) -> Array:
    """The product of bfloat16 ``a`` and ``b``, accumulated and returned in float32.

    XLA:CPU rejects some of these products at run time when it stores the float32 result
    transposed ("Unsupported element type for DotThunk::Execute"), as in the derivative of
    attention's ``Q K^T``; the ``cpu`` kernel set lays them out itself.
    """
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def einsum(
    spec: str,
    a: Array,
    b: Array,
    precision: str = "float32",
    preferred_element_type: Any = None,
    product: Product = plain_product,
) -> Array:
    """``jnp.einsum(spec, a, b)`` at ``precision``, its products formed by ``product``.

    Differentiable: for C = A B and a cotangent G, dA = G B^T and dB = A^T G are computed
    at the same precision. ``spec`` names two operands and every index appears in exactly
    two of (a, b, output). The result has ``preferred_element_type`` if given, else the
    operands' common dtype.
    """
    check(precision)
    out_dtype = jnp.dtype(preferred_element_type or jnp.result_type(a, b))
    if precision != "bfloat16" and product is plain_product:
        return jnp.einsum(
            spec,
            a,
            b,
            precision=lax_precision(precision),
            preferred_element_type=preferred_element_type,
        )
    dtypes = (jnp.dtype(a.dtype), jnp.dtype(b.dtype), out_dtype)
    return _einsum(product, spec, precision, dtypes, a, b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _einsum(product: Product, spec: str, precision: str, dtypes: tuple, a: Array, b: Array):
    return product(spec, a, b, precision).astype(dtypes[2])


def _einsum_fwd(product: Product, spec: str, precision: str, dtypes: tuple, a: Array, b: Array):
    if precision == "bfloat16":  # saved at half the size, rounded once
        a, b = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    return product(spec, a, b, precision).astype(dtypes[2]), (a, b)


def _einsum_bwd(product: Product, spec: str, precision: str, dtypes: tuple, res: tuple, g):
    a, b = res
    sa, sb, out = operands(explicit(spec, a.ndim, b.ndim))
    grad_a = product(f"{out},{sb}->{sa}", g, b, precision)  # G B^T
    grad_b = product(f"{sa},{out}->{sb}", a, g, precision)  # A^T G
    return grad_a.astype(dtypes[0]), grad_b.astype(dtypes[1])


_einsum.defvjp(_einsum_fwd, _einsum_bwd)


def dot_general(precision: str, product: Product = plain_product) -> Callable[..., Array]:
    """A ``lax.dot_general`` for Flax's ``Dense(dot_general=...)`` at ``precision``."""
    check(precision)
    if precision != "bfloat16" and product is plain_product:
        return functools.partial(_lax_dot_general, lax_precision(precision))

    def rounded(lhs: Array, rhs: Array, dimension_numbers: Any, **_: Any) -> Array:
        return einsum(
            spec(lhs.ndim, rhs.ndim, dimension_numbers), lhs, rhs, precision, None, product
        )

    return rounded


def _lax_dot_general(
    lax_precision: jax.lax.Precision,
    lhs: Array,
    rhs: Array,
    dimension_numbers: Any,
    precision: Any = None,
    **kwargs: Any,
) -> Array:
    """``lax.dot_general`` at ``lax_precision`` (a layer's own ``precision`` is ignored)."""
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=lax_precision, **kwargs)


def spec(lhs_ndim: int, rhs_ndim: int, dimension_numbers: Any) -> str:
    """The einsum spec of a ``dot_general``: batch dims, then lhs free, then rhs free."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    letters = iter(string.ascii_letters)
    lhs = [next(letters) for _ in range(lhs_ndim)]
    rhs = [next(letters) for _ in range(rhs_ndim)]
    pairs = zip((*lhs_contract, *lhs_batch), (*rhs_contract, *rhs_batch), strict=True)
    for i, j in pairs:  # contracted and batch dimensions share a letter
        rhs[j] = lhs[i]
    shared = set(lhs_contract) | set(lhs_batch)
    out = [lhs[i] for i in lhs_batch]
    out += [c for i, c in enumerate(lhs) if i not in shared]
    out += [c for j, c in enumerate(rhs) if j not in set(rhs_contract) | set(rhs_batch)]
    return f"{''.join(lhs)},{''.join(rhs)}->{''.join(out)}"


def explicit(spec: str, a_ndim: int, b_ndim: int) -> str:
    """``spec`` with ``...`` replaced by letters it does not use, as many as it stands for."""
    if "..." not in spec:
        return spec
    sa, sb, out = operands(spec)
    stands_for = {s: ndim - len(s) + 3 for s, ndim in ((sa, a_ndim), (sb, b_ndim)) if "..." in s}
    n = max(stands_for.values())
    spare = "".join(c for c in string.ascii_letters if c not in spec)[:n]
    fill = lambda s: s.replace("...", spare[n - stands_for.get(s, 0) :])  # noqa: E731
    return f"{fill(sa)},{fill(sb)}->{out.replace('...', spare)}"


def operands(spec: str) -> tuple[str, str, str]:
    """``'ab,bc->ac'`` -> ``('ab', 'bc', 'ac')``."""
    inputs, out = spec.split("->")
    sa, sb = inputs.split(",")
    return sa, sb, out
