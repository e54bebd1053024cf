"""The compiled base step (plan, one H100, bfloat16 + cuDNN, the paper's 25,000 tokens)
holds under 5.6 GiB of temporaries (5.54). Its peak, the logits' backward, holds the
activations kept for the backward pass and one logits-sized buffer. Dropout's masks are kept
as bits, so the step with dropout holds at most its packed masks more than the step without
(``kernels.dropout``; 32-bit random words or booleans of every dropped activation would add
0.36 GiB at the peak); cuDNN attention keeps no masked copy of its output
(``model.attention``: 0.43 GiB); each post-LN sub-layer's LayerNorm keeps its output, not
its input, for the backward pass (``kernels.norm``: 0.72 GiB). Without JAX's CUDA plugin
(``pip install -e '.[gpu-aot]'``) the test skips."""

import pytest

from transformer_jax.aot import programs
from transformer_jax.aot.plan import make_plan
from transformer_jax.configs.base import get_config
from transformer_jax.training.schema import RunConfig

pytestmark = [
    pytest.mark.gpu_aot,
    pytest.mark.skipif(
        not programs.plugin_available(), reason="JAX's CUDA plugin is absent: .[gpu-aot]"
    ),
]
GIB, MIB = 2**30, 2**20
DROPOUT_SITES = 6 * 2 + 6 * 3 + 2  # the sub-layers' outputs and the two embedding sums


def temp_bytes(dropout_rate: float) -> int:
    config = get_config()
    config.model.update(dtype="bfloat16", attention_impl="cudnn", dropout_rate=dropout_rate)
    config.data.tokens_per_batch = 25_000
    plan = make_plan(RunConfig.from_config(config), "h100", "1x1x1", decode_batch=0, fit=False)
    assert plan["train"]["rows_per_device"] == 97 and plan["train"]["length"] == 256
    return plan["train"]["temp_bytes"]


def test_the_base_step_is_lean_and_dropout_adds_only_its_bits():
    with_dropout, without = temp_bytes(0.1), temp_bytes(0.0)
    packed = DROPOUT_SITES * 97 * 256 * 512 // 8  # one bit per dropped element
    assert with_dropout - without <= packed + 16 * MIB, (with_dropout / GIB, without / GIB)
    assert with_dropout < 5.6 * GIB, with_dropout / GIB
