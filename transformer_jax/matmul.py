"""Matrix products at a chosen operand precision (``TransformerConfig.matmul_precision``).

``'float32'`` is the paper's arithmetic. ``'bfloat16'`` rounds both operands of every
product to bfloat16 and accumulates and returns float32, in the forward pass and in both
products of its derivative; everything between the products (softmax, LayerNorm, the
loss, the Adam update, the parameters) stays float32. It is the arithmetic of a TPU's
default matmul precision and of PyTorch's ``fp32_precision = "bf16"`` for oneDNN; on CPUs
with AMX (or AVX512-BF16) XLA runs these products several times faster.
"""

from __future__ import annotations

import functools
import string
from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array

MATMUL_PRECISIONS = ("float32", "bfloat16")


def einsum(
    spec: str,
    a: Array,
    b: Array,
    precision: str = "float32",
    preferred_element_type: Any = None,
) -> Array:
    """``jnp.einsum(spec, a, b)`` whose operands are rounded to ``precision``.

    Differentiable: for C = A B and a cotangent G, dA = G B^T and dB = A^T G are
    computed at the same precision (einsums over the same index letters). ``spec``
    names two operands and every index appears in exactly two of (a, b, output): a
    product, not a trace or a sum. The result has ``preferred_element_type`` if given,
    else the operands' common dtype; bfloat16 products accumulate in float32.
    """
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul_precision must be one of {MATMUL_PRECISIONS}, got {precision!r}")
    if precision == "float32":
        return jnp.einsum(spec, a, b, preferred_element_type=preferred_element_type)
    out_dtype = preferred_element_type or jnp.result_type(a, b)
    dtypes = (jnp.dtype(a.dtype), jnp.dtype(b.dtype), jnp.dtype(out_dtype))
    return _rounded_einsum(spec, dtypes, a, b)


def product(spec: str, a: Array, b: Array, precision: str) -> Array:
    """The product alone (no custom derivative), for use inside derivatives.

    ``'bfloat16'``: operands rounded to bfloat16, accumulated and returned in float32.
    XLA's CPU backend has bfloat16 kernels only for products that contract the left
    operand's minor dimension (``x W``, ``G W^T``); it runs the others (``X^T G``) in
    float32 or, inside a training step, fails at run time (jax 0.10.2: "Unsupported
    element type for DotThunk"). On CPU those multiply the rounded operands as float32:
    the same value, as a product of two bfloat16 numbers is exact in float32.
    """
    if precision == "float32":
        return jnp.einsum(spec, a, b)
    a, b = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    sa, sb, out = _operands(spec)
    minor_contracted = sa[-1] in sb and sa[-1] not in out
    if not minor_contracted and jax.default_backend() == "cpu":
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _rounded_einsum(spec: str, dtypes: tuple, a: Array, b: Array) -> Array:
    return product(spec, a, b, "bfloat16").astype(dtypes[2])


def _rounded_einsum_fwd(spec: str, dtypes: tuple, a: Array, b: Array) -> tuple[Array, tuple]:
    a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)  # saved at half the size
    return product(spec, a16, b16, "bfloat16").astype(dtypes[2]), (a16, b16)


def _rounded_einsum_bwd(spec: str, dtypes: tuple, residuals: tuple, g: Array) -> tuple:
    a16, b16 = residuals
    sa, sb, out = _operands(spec)
    grad_a = product(f"{out},{sb}->{sa}", g, b16, "bfloat16")  # G B^T
    grad_b = product(f"{sa},{out}->{sb}", a16, g, "bfloat16")  # A^T G
    return grad_a.astype(dtypes[0]), grad_b.astype(dtypes[1])


_rounded_einsum.defvjp(_rounded_einsum_fwd, _rounded_einsum_bwd)


def _operands(spec: str) -> tuple[str, str, str]:
    """``'ab,bc->ac'`` -> ``('ab', 'bc', 'ac')``."""
    inputs, out = spec.split("->")
    sa, sb = inputs.split(",")
    return sa, sb, out


def dot_general(precision: str) -> Any:
    """The ``dot_general`` for Flax's ``Dense(dot_general=...)`` layers at ``precision``."""
    return jax.lax.dot_general if precision == "float32" else rounded_dot_general


def rounded_dot_general(lhs: Array, rhs: Array, dimension_numbers: Any, **_: Any) -> Array:
    """``lax.dot_general`` at bfloat16 operand precision (differentiable, as :func:`einsum`)."""
    return einsum(_spec(lhs.ndim, rhs.ndim, dimension_numbers), lhs, rhs, "bfloat16")


def _spec(lhs_ndim: int, rhs_ndim: int, dimension_numbers: Any) -> str:
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
