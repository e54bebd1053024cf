"""Shared test settings: the tiny model configuration and a batch for it, XLA's settings for
the session (unoptimised CPU code, one compilation cache) and the environment without them
(``user_environment``), and which heavy tests are slow.

Test modules import ``TINY_CONFIG`` (``from conftest import TINY_CONFIG``) and state what
they change with ``TINY_CONFIG.replace(...)``; tests take the ``tiny_config`` and
``tiny_batch`` fixtures.
Nothing here starts a JAX backend at import: tests that set ``XLA_FLAGS`` still can.
"""

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

import jax
import numpy as np
import pytest

from transformer_jax import TransformerConfig
from transformer_jax.ids import BOS_ID, EOS_ID, PAD_ID

ROOT = Path(__file__).resolve().parents[1]  # the repository

# The variables set below, as pytest found them: kept in the environment before they change,
# so that pytest-xdist workers, started after, read the values their controller found.
SESSION_VARIABLES = (
    "XLA_FLAGS",
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
)
_FOUND = "TRANSFORMER_JAX_TESTS_FOUND_ENVIRONMENT"
os.environ.setdefault(
    _FOUND, json.dumps({name: os.environ.get(name) for name in SESSION_VARIABLES})
)


def user_environment() -> dict[str, str]:
    """The environment pytest was started in, without this file's XLA settings: what a
    user's ``python file.py`` gets."""
    found = json.loads(os.environ[_FOUND])
    environment = {k: v for k, v in os.environ.items() if k not in found and k != _FOUND}
    return environment | {k: v for k, v in found.items() if v is not None}


# The suite compiles hundreds of small XLA programs and runs each a few times: LLVM's
# optimisation of their CPU code costs more than it saves. Read when JAX starts its
# backend; subprocesses and notebook kernels inherit it. A level set by the user is kept.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0"
    os.environ["XLA_FLAGS"] = flags.strip()

# One persistent XLA compilation cache for the session: the same tiny programs compile once,
# whichever test, pytest-xdist worker, train.py subprocess or notebook kernel asks first
# (workers and subprocesses inherit the variables). A fresh folder, removed at the end,
# unless the user chose one.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="tj-test-xla-cache-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], True)
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update(
    "jax_persistent_cache_min_compile_time_secs",
    float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", 0)),
)

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


def flip_a_bit(directory) -> None:
    """Flip one bit in the middle of the largest file under ``directory`` (a damaged
    checkpoint item): of its array data (files in ``d/`` folders) where it has any, since
    Orbax may spread the arrays over several files smaller than its ``_METADATA``."""
    paths = [os.path.join(b, n) for b, _, names in os.walk(directory) for n in names]
    data = [p for p in paths if os.path.basename(os.path.dirname(p)) == "d"]
    path = max(data or paths, key=os.path.getsize)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10
    open(path, "wb").write(bytes(data))


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


# Heavy tests with a property of their own, marked slow here: CI runs them after the default
# run (``.ci/run``: ``pytest -m slow``). A name without brackets covers all its parameters.
HEAVY_RUN_BY_CI = {
    "tests/training/test_old_workdir.py::test_a_workdir_of_commit_7a0f9a5_resumes": (
        "a train.py process resuming a saved workdir"
    ),
    "tests/test_notebooks.py::test_notebook_executes": "seven fresh kernels, training runs",
    "tests/training/test_loop.py::"
    "test_sigkill_then_resume_matches_an_uninterrupted_run_and_sigterm_saves": (
        "three train.py processes and a 120-step reference run"
    ),
    "tests/training/test_parallel.py::test_devices_and_parallel_kinds_agree": (
        "a 4-device subprocess compiling pmap and shard_map steps (the `results` fixture)"
    ),
    "tests/training/test_parallel.py::"
    "test_gradient_accumulation_equals_one_step_on_the_whole_batch": "the same subprocess",
    "tests/training/test_parallel.py::test_each_device_gets_its_own_dropout_key": (
        "the same subprocess"
    ),
    "tests/training/test_parallel.py::test_weight_decay_is_the_same_on_one_and_four_devices": (
        "the same subprocess"
    ),
    "tests/inference/test_search.py::test_decoder_only_model_decodes_over_its_cache": (
        "eager greedy, cached and beam decoding of a decoder-only model"
    ),
    "tests/training/test_steps.py::test_donated_steps_use_the_states_key": (
        "three training steps by hand, eagerly, and three donated ones"
    ),
    "tests/inference/test_decoding.py::test_sentence_alone_equals_inside_padded_batch": (
        "greedy and beam search compiled for five shapes"
    ),
    "tests/inference/test_decoding.py::test_cached_steps_equal_full_decoder_pass[variant1]": (
        "the second and third configurations; [variant0], the paper's, stays in the default run"
    ),
    "tests/inference/test_decoding.py::test_cached_steps_equal_full_decoder_pass[variant2]": (
        "as [variant1]"
    ),
    "tests/inference/test_decoding.py::test_min_len_eos_none_and_sampling_through_the_wrappers": (
        "three searches compiled; the rules themselves are checked by test_search.py"
    ),
    "tests/inference/test_decoding.py::test_large_beam_finds_the_exhaustive_best": (
        "a beam of 96 and a full pass per hypothesis"
    ),
    "tests/kernels/test_matmul.py::"
    "test_model_at_bfloat16_matmul_precision_is_close_to_float32_and_not_equal": (
        "the model compiled at two precisions; the bfloat16 products themselves are checked "
        "per product in the default run"
    ),
    "tests/kernels/test_kernels.py::test_xla_and_cpu_kernels_give_the_same_logits_and_gradients"
    "[bfloat16-products]": "the kernel sets are compared in float32 by [float32]",
    "tests/kernels/test_malloc.py::test_large_buffers_come_from_the_heap_and_stay_there": (
        "subprocesses allocating a 64 MB array"
    ),
    "tests/model/test_model.py::test_both_norms_learn_a_copy_task": "300 training steps per norm",
    "tests/model/test_model.py::TestShapes::test_encode_decode_halves__with_jit": (
        "the jitted twin of __without_jit, which stays in the default run"
    ),
    "tests/model/test_scan_layers.py::test_cached_decoding_equals_the_unrolled_model": (
        "cached decoding compiled scanned and unrolled"
    ),
    "tests/training/test_steps.py::"
    "test_accumulated_micro_batches_sum_to_the_whole_batch_without_dropout": (
        "gradients compiled for three batch shapes"
    ),
    "tests/training/test_steps.py::test_decoder_only_model_learns_a_sequence": (
        "a decoder-only training run"
    ),
    "tests/training/test_nothing_lost.py::"
    "test_train_py_mistakes_are_one_line_with_a_failure_code": (
        "four train.py processes; one mistake's line is checked by "
        "test_loop.py::test_train_py_prints_bad_config_without_traceback"
    ),
    "tests/training/test_loop.py::test_corrupt_latest_checkpoint_falls_back_to_the_previous": (
        "two runs"
    ),
    "tests/training/test_loop.py::test_non_finite_parameters_are_never_saved": (
        "a run saving a checkpoint every step"
    ),
    "tests/training/test_run_info.py::test_the_loop_writes_what_it_prints_and_a_resume_keeps_it": (
        "a run and its resume"
    ),
    **{
        f"tests/training/test_nothing_lost.py::{name}": "the `trained` fixture: a 4-step run"
        for name in (
            "test_a_config_change_is_refused_before_anything_is_written",
            "test_a_resumable_change_is_recorded_and_config_json_follows",
            "test_a_checkpoint_of_other_shapes_is_a_mismatch_not_unreadable",
            "test_a_flipped_bit_is_caught_and_the_previous_checkpoint_used",
            "test_a_second_writer_gets_the_holders_pid",
            "test_a_failed_save_is_reported_at_once",
        )
    },
    "tests/multihost/test_multihost.py::"
    "test_two_processes_agree_on_flags_and_receive_process_zeros_bytes": (
        "two processes starting JAX's distributed runtime"
    ),
    "tests/multihost/test_multihost.py::"
    "test_train_py_under_mpirun_without_the_switch_is_refused_in_one_line": (
        "train.py processes; the refusal itself is checked in-process by "
        "test_a_launcher_without_the_switch_is_refused"
    ),
    "tests/training/test_loop.py::test_tfds_source_end_to_end_with_mock_data": (
        "a run on mocked TFDS data: tokenizer, training, evaluation"
    ),
    "tests/test_readme_examples.py::test_readme_example_prints_what_it_says": (
        "each README example a fresh process compiling with XLA's default optimisation; "
        "test_public_api.py runs the variant in the default run"
    ),
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        heavy = item.nodeid in HEAVY_RUN_BY_CI or item.nodeid.split("[")[0] in HEAVY_RUN_BY_CI
        if item.nodeid in REDUNDANT_HEAVY or heavy:
            item.add_marker(pytest.mark.slow)


# What -m deselected, counted in the summary: pytest-xdist's workers deselect, and the
# controller's summary line would not show it.
EXCLUDED_MARKERS = ("slow", "integration", "benchmark_internals", "gpu_aot")
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
            "-m integration, -m benchmark_internals, -m gpu_aot"
        )
