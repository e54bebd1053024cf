"""``matmul_precision``: 'float32' at the highest precision, 'bfloat16' products of
bfloat16-rounded operands (float32 elsewhere), in both kernel sets.

The reference for every product is the float32 einsum of operands rounded to bfloat16
by hand (exact: a product of two bfloat16 numbers fits in float32), so the checks are
tight (1e-5); the unrounded float32 product differs by far more, so a path that skipped
the rounding (or rounded the result too) fails them.
"""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_CONFIG
from test_kernels import bfloat16_products_on_cpu  # noqa: F401 (fixture)

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.kernels import matmul, precision
from transformer_jax.kernels.matmul import tied_logits
from transformer_jax.training.loss import loss_and_metrics


def rounded(x):
    return x.astype(jnp.bfloat16).astype(jnp.float32)


def normal(seed, *shape):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def close(actual, expected, tol=1e-5):
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * np.abs(expected).max())


SPECS = [  # (spec, a shape, b shape): every product the model takes, by layout
    ("td,df->tf", (6, 8), (8, 5)),  # x W (Dense)
    ("td,dhk->thk", (6, 8), (8, 2, 3)),  # x W^Q (DenseGeneral to heads)
    ("thk,hkd->td", (6, 2, 3), (2, 3, 8)),  # Concat(heads) W^O
    ("bqhd,bkhd->bhqk", (2, 4, 3, 8), (2, 5, 3, 8)),  # Q K^T
    ("bhqk,bkhd->bqhd", (2, 3, 4, 5), (2, 5, 3, 8)),  # weights V
    ("...d,vd->...v", (2, 3, 8), (11, 8)),  # x E^T (tied logits)
]


@pytest.mark.parametrize("einsum", [precision.einsum, matmul.einsum], ids=["xla", "cpu"])
@pytest.mark.parametrize("spec,a_shape,b_shape", SPECS)
@pytest.mark.usefixtures("bfloat16_products_on_cpu")
def test_bfloat16_product_and_both_gradients_use_rounded_operands(spec, a_shape, b_shape, einsum):
    a, b = normal(0, *a_shape), normal(1, *b_shape)
    out_shape = jax.eval_shape(lambda a, b: jnp.einsum(spec, a, b), a, b).shape
    g = normal(2, *out_shape)
    out, vjp = jax.vjp(lambda a, b: einsum(spec, a, b, "bfloat16"), a, b)
    grad_a, grad_b = vjp(g)
    assert out.dtype == grad_a.dtype == grad_b.dtype == jnp.float32

    ref, ref_vjp = jax.vjp(lambda a, b: jnp.einsum(spec, a, b), rounded(a), rounded(b))
    ref_a, ref_b = ref_vjp(rounded(g))  # dA = G B^T, dB = A^T G, all operands rounded
    close(out, ref)
    close(grad_a, ref_a)
    close(grad_b, ref_b)
    unrounded = jnp.einsum(spec, a, b)
    assert np.abs(np.asarray(out - unrounded)).max() > 1e-3 * np.abs(unrounded).max()


@pytest.mark.parametrize(
    "shape,now,wanted",
    [
        ((384, 256), "ab", "ba"),  # tiles of 128 (E^T, W^T)
        ((2, 6, 3, 8), "bqhd", "bhqd"),  # heads to the front; the innermost axis cut in 2
        ((2, 6, 3, 8), "bqhd", "bhdq"),  # K^T per head
        ((6, 2, 3), "thk", "hkt"),
        ((7, 5), "ab", "ba"),  # no tile divides 5: transposed halves
        ((1, 4, 1), "abc", "cba"),
    ],
)
def test_laid_out_is_the_transpose(shape, now, wanted):
    x = normal(0, *shape)
    perm = [now.index(c) for c in wanted]
    out = matmul._laid_out(x, now, list(wanted))
    np.testing.assert_array_equal(out, jnp.transpose(x, perm))
    if x.ndim == 2:
        np.testing.assert_array_equal(matmul.transposed(x), x.T)


def test_after_keeps_the_value_and_the_dependency():
    x, y = normal(0, 4, 3), normal(1, 5)
    np.testing.assert_array_equal(matmul.after(x, y), x)
    hlo = jax.jit(matmul.after).lower(x, y).compile().as_text()
    assert "multiply" in hlo  # not folded away: what reads the result waits for y
    assert matmul.after(x, jnp.zeros((0,))) is x


def precisions(f, *args):
    """The precision of each product in the derivative's jaxpr (forward and backward)."""
    jaxpr = str(jax.make_jaxpr(jax.grad(f, argnums=tuple(range(len(args)))))(*args))
    return re.findall(r"precision=\(?(?:Precision\.)?(\w+)", jaxpr)


@pytest.mark.parametrize("name,expected", [("float32", "HIGHEST"), ("tf32", "DEFAULT")])
def test_float32_products_carry_their_precision_and_bad_precision_raises(name, expected):
    """'float32' is float32 arithmetic also on TF32 hardware: every product of the plain
    einsum, its derivative and dense layers says Precision.HIGHEST."""
    a, b = normal(0, 6, 8), normal(1, 8, 5)
    np.testing.assert_array_equal(
        precision.einsum("td,df->tf", a, b, name), jnp.einsum("td,df->tf", a, b)
    )
    for einsum in (precision.einsum, matmul.einsum):
        found = precisions(lambda a, b, f=einsum: f("td,df->tf", a, b, name).sum(), a, b)
        assert found and set(found) == {expected}, found
    for dot_general in (precision.dot_general(name), matmul.dot_general(name)):
        layer = nn.Dense(5, dot_general=dot_general)
        params = nn.unbox(layer.init(jax.random.PRNGKey(0), a))
        found = precisions(lambda p, layer=layer: layer.apply(p, a).sum(), params)
        assert found and set(found) == {expected}, found
    with pytest.raises(ValueError, match="matmul_precision must be one of"):
        precision.einsum("td,df->tf", a, b, "float16")
    with pytest.raises(ValueError, match="matmul_precision"):
        TransformerConfig(matmul_precision="float16")


@pytest.mark.parametrize(
    "dims,a_shape,b_shape",
    [
        ((((1,), (0,)), ((), ())), (6, 8), (8, 5)),  # Dense
        ((((1,), (0,)), ((), ())), (6, 8), (8, 2, 3)),  # DenseGeneral to heads
        ((((1, 2), (0, 1)), ((), ())), (6, 2, 3), (2, 3, 8)),  # DenseGeneral from heads
        ((((2,), (1,)), ((0,), (0,))), (4, 6, 8), (4, 8, 5)),  # batched
    ],
)
def test_dot_general_matches_lax_dot_general_on_rounded_operands(dims, a_shape, b_shape):
    a, b = normal(0, *a_shape), normal(1, *b_shape)
    for dot_general in (precision.dot_general, matmul.dot_general):
        ours = dot_general("bfloat16")(a, b, dims)
        close(ours, jax.lax.dot_general(rounded(a), rounded(b), dims))


@pytest.mark.parametrize(
    "dims,a_shape,b_shape",
    [
        ((((1,), (0,)), ((), ())), (6, 8), (8, 5)),  # Dense
        ((((2,), (0,)), ((), ())), (2, 6, 8), (8, 2, 3)),  # to heads, [batch, length] input
        ((((1, 2), (0, 1)), ((), ())), (6, 2, 3), (2, 3, 8)),  # from heads
        ((((2,), (1,)), ((0,), (0,))), (4, 6, 8), (4, 8, 5)),  # batched: lax's own
        ((((0,), (0,)), ((), ())), (8, 6), (8, 5)),  # contracting a leading lhs axis: lax's
    ],
)
def test_flat_dot_general_is_lax_dot_general(dims, a_shape, b_shape):
    a, b = normal(0, *a_shape), normal(1, *b_shape)
    expected = jax.lax.dot_general(a, b, dims, precision="highest")
    close(matmul.flat_dot_general(a, b, dims, precision="highest"), expected)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's layouts")
@pytest.mark.parametrize("precision,allowed", [("float32", 0), ("bfloat16", 1)])
@pytest.mark.parametrize(
    "features,axis,x_shape",
    [(64, -1, (128, 32)), ((4, 16), -1, (128, 32)), (32, (-2, -1), (128, 4, 16))],
)
def test_dense_layer_gradients_copy_no_kernel(precision, allowed, features, axis, x_shape):
    """Counted in the compiled gradient: no transposing copy of the kernel (to or from
    heads, XLA copied it for the input's gradient); at bfloat16 the input's for the
    kernel's gradient (XLA's bfloat16 kernels take no transposed left operand)."""
    layer = nn.DenseGeneral(
        features, axis=axis, use_bias=False, dot_general=matmul.dot_general(precision)
    )
    x = normal(0, *x_shape)
    params = nn.unbox(layer.init(jax.random.PRNGKey(0), x))
    grad = jax.jit(jax.grad(lambda p, x: layer.apply(p, x).sum(), argnums=(0, 1)))
    hlo = grad.lower(params, x).compile().as_text()
    entry = hlo[hlo.index("ENTRY") :]
    copies = re.findall(r"= \S+ (?:copy|transpose)\(|%(?:copy|transpose)\S*fusion\S* = ", entry)
    assert len(copies) == allowed, entry


def test_dense_layers_take_the_rounded_product():
    dense = nn.Dense(5, dot_general=matmul.dot_general("bfloat16"))
    x = normal(0, 6, 8)
    params = nn.unbox(dense.init(jax.random.PRNGKey(0), x))
    kernel, bias = params["params"]["kernel"], params["params"]["bias"]
    close(dense.apply(params, x), rounded(x) @ rounded(kernel) + bias)


def test_tied_logits_gradient_at_bfloat16():
    x, table, g = normal(0, 2, 3, 8), normal(1, 11, 8), normal(2, 2, 3, 11)
    out, vjp = jax.vjp(lambda x, e: tied_logits(x, e, "bfloat16"), x, table)
    plain = lambda x, e: jnp.einsum("...d,vd->...v", x, e)  # noqa: E731
    ref, ref_vjp = jax.vjp(plain, rounded(x), rounded(table))
    close(out, ref)
    for ours, expected in zip(vjp(g), ref_vjp(rounded(g)), strict=True):
        close(ours, expected)


CFG = TINY_CONFIG.replace(max_len=512)
SRC = jnp.array([[4, 5, 6, 7, 3], [8, 9, 3, 0, 0]], jnp.int32)
TGT = jnp.array([[2, 4, 5, 6, 7, 9], [2, 8, 9, 3, 0, 0]], jnp.int32)


def loss_and_grads(config, params):
    model = Transformer(config)

    def loss(p):
        logits = model.apply({"params": p}, SRC, TGT[:, :-1])
        return loss_and_metrics(logits, TGT[:, 1:], 0, 0.1)[0]

    return jax.jit(jax.value_and_grad(loss))(params)


def test_model_at_bfloat16_matmul_precision_is_close_to_float32_and_not_equal():
    """Same parameters (the option adds none); logits, loss and gradients within
    bfloat16 rounding of the float32 model's, and the logits do differ."""
    fast = CFG.replace(matmul_precision="bfloat16")
    params = nn.unbox(Transformer(CFG).init(jax.random.PRNGKey(0), SRC, TGT[:, :-1])["params"])
    fast_params = nn.unbox(
        Transformer(fast).init(jax.random.PRNGKey(0), SRC, TGT[:, :-1])["params"]
    )
    jax.tree.map(np.testing.assert_array_equal, params, fast_params)

    logits = Transformer(CFG).apply({"params": params}, SRC, TGT[:, :-1])
    fast_logits = Transformer(fast).apply({"params": params}, SRC, TGT[:, :-1])
    difference = np.abs(np.asarray(fast_logits - logits)).max()
    assert 1e-4 < difference < 0.05 * np.abs(np.asarray(logits)).max()

    loss, grads = loss_and_grads(CFG, params)
    fast_loss, fast_grads = loss_and_grads(fast, params)
    assert abs(float(fast_loss) - float(loss)) < 1e-2 * float(loss)
    flat, fast_flat = jax.tree.leaves(grads), jax.tree.leaves(fast_grads)
    for g, fg in zip(flat, fast_flat, strict=True):
        cosine = float(jnp.vdot(g, fg) / (jnp.linalg.norm(g) * jnp.linalg.norm(fg) + 1e-30))
        assert cosine > 0.9  # rounding errors compound through the layers (0.96-1.0 here)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's layout rule")
def test_every_product_of_the_training_step_runs_on_bfloat16_operands():
    """XLA's CPU backend converts a bfloat16 product whose operands are not stored as
    ``[batch, m, k] x [batch, k, n]`` or ``[batch, n, k]`` to float32 (~4x slower);
    ``matmul.product`` lays them out so. Counted in the compiled forward and backward
    pass of the model."""
    fast = CFG.replace(matmul_precision="bfloat16")
    params = nn.unbox(Transformer(fast).init(jax.random.PRNGKey(0), SRC, TGT[:, :-1])["params"])
    model = Transformer(fast)

    def loss(p):
        return loss_and_metrics(model.apply({"params": p}, SRC, TGT[:, :-1]), TGT[:, 1:], 0, 0.1)[0]

    hlo = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
    shapes = dict(re.findall(r"%(\S+) = (\w+)\[", hlo))
    operands = [
        re.search(r" dot\(([^)]*)\)", line).group(1).split(", ")
        for line in hlo.splitlines()
        if " dot(" in line
    ]
    assert len(operands) >= 3 * 6 * CFG.num_decoder_layers  # every layer's products, fwd + bwd
    dtypes = {shapes[name.lstrip("%")] for pair in operands for name in pair}
    assert dtypes == {"bf16"}
