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
import math
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

    ``'float32'``: formed in the operands' order and then transposed to ``spec``'s output
    (``jnp.einsum`` would swap the operands instead, and XLA's CPU backend then copies the
    wider one transposed: for the tied embedding's gradient, the ``[tokens, vocab]`` one).

    ``'bfloat16'``: operands rounded to bfloat16, accumulated and returned in float32.
    XLA's CPU backend runs a bfloat16 product with its bfloat16 (AMX) kernels only when
    the left operand is stored as ``[batch, m, k]`` and the right one as ``[batch, k, n]``
    or ``[batch, n, k]``; any other layout, a transpose it folds into the product
    included, it runs in float32, ~4x slower. So on CPU the operands are first laid out
    that way (:func:`_laid_out`), as ``A B`` or as ``(B^T A^T)^T`` with either right
    layout, whichever copies fewest elements, and each group of indices (batch, free,
    contracted) is merged into one dimension.
    """
    sa, sb, out = _operands(_explicit(spec, a.ndim, b.ndim))
    if precision == "float32":
        batch, _, free_a, free_b = _indices(sa, sb, out)
        natural = "".join(batch + free_a + free_b)
        return jnp.einsum(f"{natural}->{out}", jnp.einsum(f"{sa},{sb}->{natural}", a, b))
    a, b = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    if jax.default_backend() != "cpu":
        return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)
    size = dict(zip(sa, a.shape, strict=True)) | dict(zip(sb, b.shape, strict=True))
    count = lambda idx: math.prod(size[c] for c in idx)  # noqa: E731

    # A layout names groups of indices: z batch, m free in the left operand, k contracted,
    # n free in the right one. The product runs on each group merged into one dimension
    # (a free reshape once laid out; unmerged, XLA copies a right operand with several
    # contracted dimensions into [k, n] again).
    def groups(left: str, right: str) -> dict[str, list[str]]:
        batch, contracted, free_l, free_r = _indices(left, right, out)
        return {"z": batch, "m": free_l, "k": contracted, "n": free_r}

    def indices(group: dict[str, list[str]], layout: str) -> list[str]:
        return [c for g in layout for c in group[g]]

    def copied(left: str, right: str, right_layout: str) -> int:  # float32 result: x2
        group = groups(left, right)
        stored = ((left, "zmk", 1), (right, right_layout, 1), (out, "zmn", 2))
        return sum(w * count(s) for s, layout, w in stored if list(s) != indices(group, layout))

    choices = [(sa, sb, "zkn"), (sa, sb, "znk"), (sb, sa, "zkn"), (sb, sa, "znk")]
    left, right, right_layout = min(choices, key=lambda c: copied(*c))  # first of equals
    if left != sa:
        a, b = b, a
    group = groups(left, right)

    def merged(x: Array, now: str, layout: str) -> tuple[str, Array]:
        kept = "".join(g for g in layout if group[g])
        shape = [count(group[g]) for g in kept]
        return kept, _laid_out(x, now, indices(group, layout)).reshape(shape)

    (sl, lhs), (sr, rhs) = merged(a, left, "zmk"), merged(b, right, right_layout)
    so = "".join(g for g in "zmn" if group[g])
    y = jnp.einsum(f"{sl},{sr}->{so}", lhs, rhs, preferred_element_type=jnp.float32)
    res = indices(group, "zmn")
    return _laid_out(y.reshape([size[c] for c in res]), "".join(res), list(out))


def _indices(sa: str, sb: str, out: str) -> tuple[list[str], list[str], list[str], list[str]]:
    """A product's batch indices (in the output's order), contracted indices, and the
    free indices of each operand."""
    batch = [c for c in out if c in sa and c in sb]
    contracted = [c for c in sa if c in sb and c not in out]
    return batch, contracted, [c for c in sa if c not in sb], [c for c in sb if c not in sa]


def transposed(x: Array) -> Array:
    """The matrix ``x^T``, copied: XLA does not fold this transpose into the product
    that made ``x`` (see :func:`_laid_out`). Where ``x`` is a bfloat16 product's float32
    result, ``x.T`` fails at run time on XLA:CPU (jaxlib 0.10.2: "Unsupported element
    type for DotThunk::Execute: BF16 x BF16 = F32")."""
    return _laid_out(x, "ab", ["b", "a"])


def _laid_out(x: Array, now: str, wanted: list[str]) -> Array:
    """``x`` (indexed by the letters ``now``) transposed to ``wanted`` and stored so.

    XLA folds a plain transpose into the product that reads it (and then runs that
    product in float32 on CPU). It keeps a blocked transpose in two passes: the input
    axis that becomes the innermost one is cut into tiles of at most 128; pass one
    transposes within each tile (its reads stay in as many cache lines as a tile is
    long), pass two moves the tiles' contiguous rows into place. For the ``[32000, 512]``
    embedding, in bfloat16: 14.7 ms, where the transposed halves of ``x`` joined (the
    fallback when no tile divides the axis) took 80 ms.
    """
    perm = [now.index(c) for c in wanted]
    if perm == list(range(x.ndim)):
        return x
    inner = perm[-1]  # the input axis that becomes the innermost one
    n = x.shape[inner]
    tile = max((t for t in range(1, min(128, n // 2) + 1) if n % t == 0), default=1)
    if tile == 1:  # no tiles: the transposed halves of x, joined, are kept as well
        axis = next((i for i, size in enumerate(x.shape) if size > 1), None)
        if axis is None:
            return jnp.transpose(x, perm)
        halves = jnp.split(x, [x.shape[axis] // 2], axis=axis)
        return jnp.concatenate([jnp.transpose(h, perm) for h in halves], axis=perm.index(axis))
    # cut: [..., n, ...] -> [..., n // tile, tile, ...]; the tile index goes first.
    cut = x.reshape(x.shape[:inner] + (n // tile, tile) + x.shape[inner + 1 :])
    moved = [a + (a > inner) for a in perm]  # perm on the cut array, tile axis = inner + 1
    moved[-1] = inner + 1
    tiles = jax.lax.optimization_barrier(jnp.transpose(cut, [inner] + moved))
    # tiles: [n // tile, *wanted (tile in place of n)]; move the tile index next to the tile.
    last = tiles.ndim - 1
    order = list(range(1, last)) + [0, last]
    return jnp.transpose(tiles, order).reshape([x.shape[p] for p in perm])


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


def after(x: Array, y: Array) -> Array:
    """``x``, made to depend on ``y``, so that XLA computes what reads it after ``y``.

    XLA's CPU backend runs independent products at the same time, each on every core. The
    tied logits' two gradient products, which both read the ``[tokens, vocab]`` gradient,
    each took 3-4x as long that way as alone (bfloat16 ``base``: 95 and 88 ms against 32
    and 22; the step 1.04x faster in order). Adds ``0 * y[0]`` to ``x`` (XLA
    does not fold a float multiplication by zero): ``x`` is unchanged unless ``y[0]`` is
    not finite, and then the gradient ``y`` belongs to is not finite either.
    """
    if y.size == 0:
        return x
    return x + jnp.zeros((), x.dtype) * y.reshape(-1)[0].astype(x.dtype)


def _explicit(spec: str, a_ndim: int, b_ndim: int) -> str:
    """``spec`` with ``...`` replaced by letters it does not use, as many as it stands for."""
    if "..." not in spec:
        return spec
    sa, sb, out = _operands(spec)
    stands_for = {s: ndim - len(s) + 3 for s, ndim in ((sa, a_ndim), (sb, b_ndim)) if "..." in s}
    n = max(stands_for.values())
    spare = "".join(c for c in string.ascii_letters if c not in spec)[:n]
    fill = lambda s: s.replace("...", spare[n - stands_for.get(s, 0) :])  # noqa: E731
    return f"{fill(sa)},{fill(sb)}->{out.replace('...', spare)}"


def _operands(spec: str) -> tuple[str, str, str]:
    """``'ab,bc->ac'`` -> ``('ab', 'bc', 'ac')``."""
    inputs, out = spec.split("->")
    sa, sb = inputs.split(",")
    return sa, sb, out


def dot_general(precision: str) -> Any:
    """The ``dot_general`` for Flax's ``Dense(dot_general=...)`` layers at ``precision``."""
    return flat_dot_general if precision == "float32" else rounded_dot_general


def flat_dot_general(lhs: Array, rhs: Array, dimension_numbers: Any, **kwargs: Any) -> Array:
    """``lax.dot_general`` of a dense layer as a product of two matrices.

    A layer to or from heads (``[d_model, heads, d_k]`` kernels) contracts or produces
    two dimensions; the gradient then contracts two, and XLA's CPU backend copies the
    kernel transposed for it. With the groups of dimensions merged (free reshapes) every
    product, forward and backward, is a plain matrix product. Other products (batch
    dimensions, contracted dimensions not trailing ``lhs`` and leading ``rhs``) are
    ``lax.dot_general``'s.
    """
    (lhs_contract, rhs_contract), batch = dimension_numbers
    n = len(lhs_contract)
    dense = (
        batch == ((), ())
        and tuple(lhs_contract) == tuple(range(lhs.ndim - n, lhs.ndim))
        and tuple(rhs_contract) == tuple(range(n))
    )
    if not dense:
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, **kwargs)
    free_l, free_r = lhs.shape[: lhs.ndim - n], rhs.shape[n:]
    k = math.prod(rhs.shape[:n])
    y = jax.lax.dot_general(
        lhs.reshape(-1, k), rhs.reshape(k, -1), (((1,), (0,)), ((), ())), **kwargs
    )
    return y.reshape(free_l + free_r)


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
