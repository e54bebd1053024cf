"""The GPU programs compiled for H100s without a GPU (``pytest -m gpu_aot``; CI's step).

Each test compiles a real program of ``configs/base.py`` or ``configs/big.py`` for one
or eight H100s (:mod:`transformer_jax.aot.programs`) and checks the optimized module:
it compiles; cuDNN attention is there exactly where asked (forward and backward of every
attention sub-layer); the per-device memory is under the GPU's; no host transfer and no
``optimization_barrier``; float32 products at HIGHEST; the eight-GPU step all-reduces,
or under ``mesh`` gathers the parameters and reduce-scatters the gradients.
Without JAX's CUDA plugin (``pip install -e '.[gpu-aot]'``) every test skips.
"""

import importlib.util

import jax
import jax.numpy as jnp
import pytest

from transformer_jax.aot import programs
from transformer_jax.aot.gpus import GPUS
from transformer_jax.training.schema import RunConfig
from transformer_jax.training.validation import validate_config

pytestmark = [
    pytest.mark.gpu_aot,
    pytest.mark.skipif(
        not programs.plugin_available(), reason="JAX's CUDA plugin is absent: .[gpu-aot]"
    ),
]
H100 = GPUS["h100"]
ROWS, LENGTH = 8, 64  # per device


def run_config(name, arithmetic):
    spec = importlib.util.spec_from_file_location(name, f"configs/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.model.platform = "gpu"
    if arithmetic == "bfloat16-cudnn":
        config.model.dtype = "bfloat16"
        config.model.attention_impl = "cudnn"
    config = RunConfig.from_config(config)
    return config, validate_config(config)


def check(compiled, model, calls):
    """The assertions every compiled program passes; ``calls``: the cuDNN attention calls
    expected with ``attention_impl='cudnn'``."""
    hlo = compiled.hlo
    assert hlo["host_transfers"] == 0 and hlo["optimization_barriers"] == 0, hlo
    assert compiled.total_bytes < H100.memory_bytes, compiled
    expected = calls if model.attention_impl == "cudnn" else 0
    assert hlo["cudnn_attention_calls"] == expected, hlo
    if model.matmul_precision == "float32" and jnp.dtype(model.dtype) == jnp.float32:
        assert hlo["dots"] > 0 and hlo["dots_below_highest"] == 0, hlo


@pytest.mark.parametrize(
    "name,arithmetic,kind,topology",
    [
        ("base", "bfloat16-cudnn", "shard_map", "1x1x8"),
        ("base", "float32", "pmap", "1x1x1"),
        ("big", "bfloat16-cudnn", "pmap", "1x1x8"),
        ("big", "float32", "shard_map", "1x1x1"),
    ],
)
def test_train_step_compiles_for_h100s(name, arithmetic, kind, topology):
    config, model = run_config(name, arithmetic)
    devices = programs.gpu_devices(H100, topology)
    config = config.replace(train={"parallel": kind})
    compiled = programs.train_program(model, config, devices, ROWS * len(devices), LENGTH)
    sublayers = model.num_encoder_layers + 2 * model.num_decoder_layers
    check(compiled, model, calls=2 * sublayers)  # forward and backward
    reduced = compiled.hlo["collectives"].get("all-reduce", {"count": 0, "bytes": 0})
    if len(devices) > 1:  # the gradients' sum over the devices
        params = programs.abstract_state(model, config).params
        assert reduced["bytes"] >= sum(x.size * 4 for x in jax.tree.leaves(params)), reduced
    else:
        assert reduced["count"] == 0, compiled.hlo


def test_mesh_train_step_compiles_for_8_h100s_with_sharded_parameters():
    config, model = run_config("big", "bfloat16-cudnn")  # train.parallel='mesh'
    config = config.replace(train={"mesh_model": 2})  # 4 x 2: FSDP over 4, TP over 2
    devices = programs.gpu_devices(H100, "1x1x8")
    compiled = programs.train_program(model, config, devices, ROWS * 4, LENGTH)
    sublayers = model.num_encoder_layers + 2 * model.num_decoder_layers
    check(compiled, model, calls=2 * sublayers)
    state = programs.abstract_state(model, config)
    whole = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
    assert compiled.argument_bytes < whole / 4, (compiled.argument_bytes, whole)
    assert {"all-gather", "reduce-scatter"} <= set(compiled.hlo["collectives"]), compiled.hlo


def test_big_mesh_step_moves_parameters_and_gradients_not_activations():
    """big's own mesh program on 8 H100s (FSDP over 8): all-gathers of the parameters at
    the compute dtype (bfloat16 matrices, float32 vectors), once; reduce-scatters of as
    many gradient bytes; no gradient all-reduce. An async collective's bytes count its
    operands and results, (1 + 1/8) x the whole. The embedding lookups read the table the
    logits gather: the all-to-alls carry only their 2 gradients (one device's bfloat16
    [rows, length, d_model] each, operands and results) to the table's shards, and ids."""
    config, model = run_config("big", "bfloat16-cudnn")
    devices = programs.gpu_devices(H100, "1x1x8")
    compiled = programs.train_program(model, config, devices, ROWS * 8, LENGTH)
    params = jax.tree.leaves(programs.abstract_state(model, config).params)
    compute = sum(x.size * (4 if x.ndim == 1 else 2) for x in params)
    moved = compiled.hlo["collectives"]
    assert moved["all-gather"]["bytes"] == pytest.approx(compute * 9 / 8, rel=0.01), moved
    assert moved["reduce-scatter"]["bytes"] == pytest.approx(compute * 9 / 8, rel=0.01), moved
    assert moved["all-reduce"]["bytes"] < 2**20, moved  # the metrics' sums
    activation = ROWS * LENGTH * model.d_model * 2
    assert 2 * 2 * activation <= moved["all-to-all"]["bytes"] < 2 * 2 * activation + 2**20, moved


@pytest.mark.parametrize("arithmetic", ["bfloat16-cudnn", "float32"])
def test_beam_search_compiles_for_an_h100(arithmetic):
    config, model = run_config("base", arithmetic)
    device = programs.gpu_devices(H100, "1x1x1")[0]
    compiled = programs.decode_program(model, config, device, 16, 64)
    check(compiled, model, calls=model.num_encoder_layers + 2 * model.num_decoder_layers)
