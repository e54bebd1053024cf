"""Matrix products laid out for XLA:CPU's kernels (the ``cpu`` kernel set).

XLA's CPU backend runs a bfloat16 product with its bfloat16 (AMX / AVX512-BF16) kernels
only when the left operand is stored as ``[batch, m, k]`` and the right one as
``[batch, k, n]`` or ``[batch, n, k]``; any other layout it computes in float32. It folds a
plain transpose into the product that reads it, copies a kernel transposed for the
gradient of a layer to or from heads, and runs independent products at the same time on
every core. :func:`product`, :func:`flat_dot_general` and :func:`tied_logits` shape the
model's products around those rules; the values are the plain products'.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from transformer_jax.kernels import precision as arithmetic

Array = jax.Array


def product(spec: str, a: Array, b: Array, precision: str) -> Array:
    """``einsum(spec, a, b)`` at ``precision`` without custom derivative.

    ``'float32'`` / ``'tf32'``: formed in the operands' order and then transposed to
    ``spec``'s output (``jnp.einsum`` would swap the operands instead, and XLA's CPU
    backend then copies the wider one transposed: for the tied embedding's gradient, the
    ``[tokens, vocab]`` one).

    ``'bfloat16'``: operands rounded to bfloat16, accumulated and returned in float32,
    first laid out for the bfloat16 kernels (:func:`_laid_out`) as ``A B`` or as
    ``(B^T A^T)^T`` with either right layout, whichever copies fewest elements, and each
    group of indices (batch, free, contracted) merged into one dimension.
    """
    sa, sb, out = arithmetic.operands(arithmetic.explicit(spec, a.ndim, b.ndim))
    if precision != "bfloat16":
        batch, _, free_a, free_b = _indices(sa, sb, out)
        natural = "".join(batch + free_a + free_b)
        ab = jnp.einsum(
            f"{sa},{sb}->{natural}", a, b, precision=arithmetic.lax_precision(precision)
        )
        return jnp.einsum(f"{natural}->{out}", ab)
    a, b = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
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
    """The matrix ``x^T``, copied, so that XLA does not fold the transpose into the
    product that made ``x`` (a folded one XLA:CPU cannot run on a bfloat16 product)."""
    return _laid_out(x, "ab", ["b", "a"])


def _laid_out(x: Array, now: str, wanted: list[str]) -> Array:
    """``x`` (indexed by the letters ``now``) transposed to ``wanted`` and stored so.

    XLA folds a plain transpose into the product that reads it. It keeps a blocked
    transpose in two passes (separated by an optimization barrier): the input axis that
    becomes the innermost one is cut into tiles of at most 128; pass one transposes within
    each tile, so that its reads stay in as many cache lines as a tile is long, pass two
    moves the tiles' contiguous rows into place.
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


def after(x: Array, y: Array) -> Array:
    """``x``, made to depend on ``y``, so that XLA computes what reads it after ``y``.

    XLA's CPU backend runs independent products at the same time, each on every core, and
    two products reading the same large operand then contend for memory. Adds ``0 * y[0]``
    to ``x`` (XLA does not fold a float multiplication by zero): ``x`` is unchanged unless
    ``y[0]`` is not finite, and then the gradient ``y`` belongs to is not finite either.
    """
    if y.size == 0:
        return x
    return x + jnp.zeros((), x.dtype) * y.reshape(-1)[0].astype(x.dtype)


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


def dot_general(precision: str) -> Any:
    """The ``dot_general`` for Flax's ``Dense(dot_general=...)`` layers at ``precision``."""
    if precision == "bfloat16":
        return arithmetic.dot_general(precision, product)
    arithmetic.check(precision)
    return functools.partial(_flat_at, arithmetic.lax_precision(precision))


def _flat_at(lax_precision: Any, lhs: Array, rhs: Array, dimension_numbers: Any, **kwargs: Any):
    """:func:`flat_dot_general` at ``lax_precision`` (a layer's own ``precision`` ignored)."""
    kwargs["precision"] = lax_precision
    return flat_dot_general(lhs, rhs, dimension_numbers, **kwargs)


def einsum(
    spec: str, a: Array, b: Array, precision: str = "float32", preferred_element_type: Any = None
) -> Array:
    """:func:`transformer_jax.kernels.precision.einsum`, bfloat16 products laid out."""
    made_by = product if precision == "bfloat16" else arithmetic.plain_product
    return arithmetic.einsum(spec, a, b, precision, preferred_element_type, made_by)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def tied_logits(x: Array, embedding: Array, precision: str = "float32") -> Array:
    """``x E^T``: ``[..., d_model] x [vocab, d_model] -> [..., vocab]``.

    Its derivative forms the embedding's gradient as ``(x^T g)^T``, a blocked transpose of
    the ``[d_model, vocab]`` product, where autodiff would transpose the ``[tokens, vocab]``
    logit gradient, and it forms that product after the input's (:func:`after`).
    """
    return product("...d,vd->...v", x, embedding, precision).astype(x.dtype)


def _tied_logits_fwd(x: Array, embedding: Array, precision: str) -> tuple[Array, tuple]:
    return tied_logits(x, embedding, precision), (x, embedding)


def _tied_logits_bwd(precision: str, residuals: tuple[Array, Array], g: Array) -> tuple:
    x, embedding = residuals
    if precision == "bfloat16":
        g = g.astype(jnp.bfloat16)  # rounded once for both products
    grad_x = product("...v,vd->...d", g, embedding, precision)
    grad_embedding = product("...d,...v->dv", after(x, grad_x), g, precision)
    return grad_x.astype(x.dtype), transposed(grad_embedding).astype(embedding.dtype)


tied_logits.defvjp(_tied_logits_fwd, _tied_logits_bwd)
