"""Shared test settings: the tiny model configuration and a batch for it.

Test modules import ``TINY_CONFIG`` (``from conftest import TINY_CONFIG``) and state what
they change with ``TINY_CONFIG.replace(...)``; tests take the ``tiny_config`` and
``tiny_batch`` fixtures.
Nothing here starts a JAX backend at import: tests that set ``XLA_FLAGS`` still can.
"""

import os
from pathlib import Path

import numpy as np
import pytest

from transformer_jax import TransformerConfig
from transformer_jax.ids import BOS_ID, EOS_ID, PAD_ID

ROOT = Path(__file__).resolve().parents[1]  # the repository

# The suite compiles hundreds of small XLA programs and runs each a few times: LLVM's
# optimisation of their CPU code costs more than it saves. Read when JAX starts its
# backend; subprocesses and notebook kernels inherit it. A level set by the user is kept.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0"
    os.environ["XLA_FLAGS"] = flags.strip()

# Two heads and two layers per stack (so that per-head and per-layer behaviour is visible),
# small enough to compile in about a second.
TINY_CONFIG = TransformerConfig(
    vocab_size=16,
    d_model=16,
    num_heads=2,
    d_ff=32,
    num_encoder_layers=2,
    num_decoder_layers=2,
    max_len=32,
)


@pytest.fixture
def tiny_config() -> TransformerConfig:
    return TINY_CONFIG


@pytest.fixture(scope="session")
def tiny_batch() -> dict[str, np.ndarray]:
    """Two pairs, the second padded: ``src`` (ends with EOS), ``tgt_in`` (starts with BOS),
    ``tgt_out`` (``tgt_in`` shifted by one, ends with EOS), ids below ``TINY_CONFIG.vocab_size``."""
    p, b, e = PAD_ID, BOS_ID, EOS_ID
    return {
        "src": np.array([[4, 5, 6, 7, e], [8, 9, e, p, p]], np.int32),
        "tgt_in": np.array([[b, 4, 5, 6, 7, 9], [b, 8, 9, p, p, p]], np.int32),
        "tgt_out": np.array([[4, 5, 6, 7, 9, e], [8, 9, e, p, p, p]], np.int32),
    }


# Heavy tests whose property another default test covers: marked slow here (run them with
# ``pytest -m slow``); the reason names what stays in the default run.
REDUNDANT_HEAVY = {
    "tests/model/test_model.py::TestShapes::test_logits_shape_and_dtype__without_jit": (
        "the eager twin of __with_jit (same shapes and dtypes); eager application stays "
        "covered by test_encode_decode_halves__without_jit"
    ),
    "tests/model/test_model.py::test_cached_decoding_equals_full_decoding": (
        "test_decoding.py::test_cached_steps_equal_full_decoder_pass checks the same on three "
        "configurations (the paper's first), jitted"
    ),
    "tests/kernels/test_kernels.py::test_xla_and_cpu_kernels_give_the_same_logits_and_gradients"
    "[bfloat16-compute]": (
        "the cpu kernels' bfloat16 operand layouts are compared by [bfloat16-products]"
    ),
    "tests/kernels/test_kernels.py::test_xla_and_cpu_kernels_give_the_same_logits_and_gradients"
    "[float32-scan-preln]": (
        "the kernel sets are compared by [float32]; scan and pre-LN against the unrolled and "
        "hand-computed model by test_scan_layers.py and test_layers_by_hand.py"
    ),
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in REDUNDANT_HEAVY:
            item.add_marker(pytest.mark.slow)


# What -m deselected, counted in the summary: pytest-xdist's workers deselect, and the
# controller's summary line would not show it.
EXCLUDED_MARKERS = ("slow", "integration", "benchmark_internals")
_deselected: dict[str, str] = {}  # node id -> the marker that excluded it


def pytest_deselected(items):
    for item in items:
        names = [m.name for m in item.iter_markers() if m.name in EXCLUDED_MARKERS]
        _deselected[item.nodeid] = names[0] if names else "not matching -m/-k"
    if items and hasattr(items[0].config, "workeroutput"):  # an xdist worker
        items[0].config.workeroutput["deselected"] = dict(_deselected)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # the xdist controller, as each worker ends
    _deselected.update(getattr(node, "workeroutput", {}).get("deselected", {}))


def pytest_terminal_summary(terminalreporter, config):
    if _deselected and not hasattr(config, "workerinput"):
        counts = {}
        for marker in _deselected.values():
            counts[marker] = counts.get(marker, 0) + 1
        parts = ", ".join(f"{n} {marker}" for marker, n in sorted(counts.items()))
        terminalreporter.write_line(
            f"deselected {len(_deselected)} tests ({parts}): run them with -m slow, "
            "-m integration, -m benchmark_internals"
        )
