"""The kernel seam (``transformer_jax.kernels``): chosen by the target platform, the ``xla``
and ``cpu`` sets give the same logits and gradients, CPU process settings only on CPU."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_CONFIG

from transformer_jax import Transformer, kernels, options
from transformer_jax.kernels import precision
from transformer_jax.training.loss import loss_and_metrics
from transformer_jax.training.schema import RunConfig, default_config
from transformer_jax.training.validation import validate_config

CFG = TINY_CONFIG.replace(attention_dropout_rate=0.1)
SRC = jnp.array([[4, 5, 6, 7, 3], [8, 9, 3, 0, 0]], jnp.int32)
TGT = jnp.array([[2, 4, 5, 6, 7, 9], [2, 8, 9, 3, 0, 0]], jnp.int32)


@pytest.fixture
def bfloat16_products_on_cpu(monkeypatch):
    """The ``xla`` set's bfloat16 products, runnable on XLA:CPU: XLA:CPU rejects some
    bfloat16 products with float32 results (``precision.bfloat16_product``); they become
    float32 products of the same bfloat16 values, exact up to the order of summation."""
    if jax.default_backend() == "cpu":

        def exact(spec, a, b):
            a, b = a.astype(jnp.float32), b.astype(jnp.float32)
            return jnp.einsum(spec, a, b, precision=jax.lax.Precision.HIGHEST)

        monkeypatch.setattr(precision, "bfloat16_product", exact)


def test_auto_is_cpu_only_on_the_cpu_target():
    assert options.resolve("auto", "cpu") == "cpu"
    for platform in ("gpu", "cuda", "rocm", "tpu"):
        assert options.resolve("auto", platform) == "xla"
    assert options.resolve("xla", "cpu") == "xla" and options.resolve("cpu", "gpu") == "cpu"
    assert TINY_CONFIG.replace(platform="gpu").kernel_set == "xla"
    assert TINY_CONFIG.replace(platform="cpu").kernel_set == "cpu"
    assert TINY_CONFIG.replace(platform="cuda", kernels="cpu").kernel_set == "cpu"
    with pytest.raises(ValueError, match="kernels must be one of"):
        TINY_CONFIG.replace(kernels="fast")
    with pytest.raises(ValueError, match="platform must be one of"):
        TINY_CONFIG.replace(platform="metal")


def test_cudnn_attention_is_refused_up_front_where_it_cannot_run():
    with pytest.raises(ValueError, match="attention_impl='cudnn' needs platform"):
        TINY_CONFIG.replace(attention_impl="cudnn", dtype=jnp.bfloat16, platform="cpu")
    with pytest.raises(ValueError, match="attention_impl='cudnn' needs dtype bfloat16"):
        TINY_CONFIG.replace(attention_impl="cudnn", platform="gpu")
    TINY_CONFIG.replace(attention_impl="cudnn", matmul_precision="bfloat16", platform="cuda")


def test_cpu_process_settings_only_on_cpu(monkeypatch):
    applied = []
    monkeypatch.setattr(kernels, "retain_freed_memory", lambda: applied.append("malloc"))
    monkeypatch.setattr(kernels, "prefer_wide_vectors", lambda: applied.append("vectors"))
    for platform in ("gpu", "cuda", "tpu"):
        assert not kernels.configure_process(platform)
    assert applied == []
    monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
    assert kernels.host_platform() == "cuda" and not kernels.configure_process("auto")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert kernels.configure_process("auto") and applied == ["malloc", "vectors"]
    monkeypatch.delenv("JAX_PLATFORMS")
    monkeypatch.setattr(kernels, "_distributions", lambda: [])
    assert kernels.host_platform() == "cpu"
    with pytest.raises(ValueError, match="model.platform must be one of"):
        kernels.configure_process("metal")


def logits_and_grads(config, params):
    model = Transformer(config)
    rngs = {"dropout": jax.random.PRNGKey(7)}

    def loss(p):
        logits = model.apply({"params": p}, SRC, TGT[:, :-1], deterministic=False, rngs=rngs)
        return loss_and_metrics(logits, TGT[:, 1:], 0, 0.1)[0], logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return logits, grads


@pytest.mark.parametrize(
    "changes,tol",
    [
        ({}, 1e-5),
        ({"scan_layers": True, "norm": "pre"}, 1e-5),
        ({"matmul_precision": "bfloat16"}, 2e-3),
        ({"dtype": jnp.bfloat16}, 5e-2),  # xla: LayerNorm's xhat from its bfloat16 output
    ],
    ids=["float32", "float32-scan-preln", "bfloat16-products", "bfloat16-compute"],
)
def test_xla_and_cpu_kernels_give_the_same_logits_and_gradients(
    changes, tol, bfloat16_products_on_cpu
):
    """With dropout on (both sets draw the same bits): same logits, same gradient of the
    label-smoothed loss, to float32 rounding (1e-5 of the largest entry) or to the
    products' bfloat16 rounding (with bfloat16 activations, the xla set's LayerNorm
    gradient reads its bfloat16 output, ``kernels.norm``)."""
    xla, cpu = (CFG.replace(kernels=k, **changes) for k in ("xla", "cpu"))
    params = nn.unbox(Transformer(xla).init(jax.random.PRNGKey(0), SRC, TGT[:, :-1])["params"])
    (lx, gx), (lc, gc) = logits_and_grads(xla, params), logits_and_grads(cpu, params)

    def close(a, b):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(np.abs(b).max(), 1e-30))

    close(lx, lc)
    jax.tree.map(close, gx, gc)


def test_only_the_cpu_set_carries_cpu_constructs():
    """The xla set's training step is plain: no optimization barrier, no threefry written
    out (32-bit shift ops), no fake dependency; the cpu set has its blocked transpose."""

    def jaxpr(config):
        params = nn.unbox(
            Transformer(config).init(jax.random.PRNGKey(0), SRC, TGT[:, :-1])["params"]
        )
        return str(jax.make_jaxpr(lambda p: logits_and_grads(config, p))(params))

    plain, tuned = (jaxpr(CFG.replace(kernels=k)) for k in ("xla", "cpu"))
    assert "optimization_barrier" not in plain and "optimization_barrier" in tuned
    threefry = re.compile(r"u32\[[^\]]*\] = shift_left")  # the mask's packing shifts bytes
    assert len(threefry.findall(plain)) == 0 < len(threefry.findall(tuned))


def test_run_configs_that_cannot_work_are_refused_before_compiling():
    config = default_config()
    config.data.source = "synthetic"
    config.model.attention_impl = "cudnn"
    config.model.dtype = "bfloat16"
    config.model.platform = "gpu"
    config.data.max_len = 100
    with pytest.raises(ValueError, match="data.max_len=100 must be a multiple of 8"):
        validate_config(RunConfig.from_config(config))
    config.data.max_len = 96
    assert validate_config(RunConfig.from_config(config)).attention_impl == "cudnn"
    config = default_config()
    config.data.source = "synthetic"
    config.model.update(kernels="xla", matmul_precision="bfloat16", platform="cpu")
    with pytest.raises(ValueError, match="does not train on XLA:CPU"):
        validate_config(RunConfig.from_config(config))
    config.model.update(matmul_precision="float32", dtype="bfloat16")
    with pytest.raises(ValueError, match="does not train on XLA:CPU"):
        validate_config(RunConfig.from_config(config))
    config.model.kernels = "auto"
    assert validate_config(RunConfig.from_config(config)).kernel_set == "cpu"
