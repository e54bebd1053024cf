"""The plan of a step that does not fit, compiled for a GPU with 100 MiB (``pytest -m
gpu_aot``): XLA's rematerialization fails to bring the tiny config's 64 x 64 step under its
limit; the plan says so in its own field and line, and XLA's warning does not reach stderr.
Without JAX's CUDA plugin (``pip install -e '.[gpu-aot]'``) the test skips."""

import dataclasses

import pytest

from transformer_jax.aot import programs
from transformer_jax.aot.gpus import GPUS
from transformer_jax.aot.plan import format_plan, make_plan
from transformer_jax.configs.tiny import get_config
from transformer_jax.training.schema import RunConfig

pytestmark = [
    pytest.mark.gpu_aot,
    pytest.mark.skipif(
        not programs.plugin_available(), reason="JAX's CUDA plugin is absent: .[gpu-aot]"
    ),
]


def test_a_step_xla_cannot_fit_is_the_plans_line_not_xlas_warning(monkeypatch, capfd):
    small = dataclasses.replace(GPUS["h100"], name="100 MiB GPU", memory_bytes=100 * 2**20)
    monkeypatch.setitem(GPUS, "small", small)
    config = get_config()
    config.data.tokens_per_batch = 64 * 64
    plan = make_plan(RunConfig.from_config(config), "small", "1x1x1", decode_batch=0, fit=False)
    train = plan["train"]
    assert train["rows_per_device"] == 64 and not train["fits"]
    could_not_fit = train["could_not_fit"]
    assert could_not_fit["limit_bytes"] < 100 * 2**20 < could_not_fit["reached_bytes"]
    assert "XLA's rematerialization could not bring the step" in format_plan(plan)
    assert "rematerialization" not in capfd.readouterr().err
