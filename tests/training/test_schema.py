"""The config schema (``training/schema.py``, ``TransformerConfig``): one declaration per
field gives the defaults ConfigDict, the checks and their one-line errors, the fields a resume
may change and ``train --help``; ``RunConfig``, the frozen run config below the command line,
and its ``config.json``."""

import ast
import dataclasses
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import pytest
from conftest import ROOT

from transformer_jax import fields
from transformer_jax.data.config import DataConfig
from transformer_jax.model.config import TransformerConfig
from transformer_jax.training import schema
from transformer_jax.training.schema import SECTIONS, RunConfig, default_config
from transformer_jax.training.validation import validate_config


def synthetic_config():
    config = default_config()
    config.data.source = "synthetic"
    return config


def test_every_config_field_has_one_declaration_with_help_and_back():
    config = default_config()
    assert set(config) == set(SECTIONS)
    for section, cls in SECTIONS.items():
        declared = fields.specs(cls)
        assert set(config[section]) == set(declared), section
        for name, (field, spec) in declared.items():
            assert spec.help.strip() and "\n" not in spec.help, f"{section}.{name}"
            assert isinstance(spec.check, fields.Check), f"{section}.{name}"
            assert spec.check.error(field.default) is None, f"{section}.{name}: its default"


def test_the_defaults_are_the_papers_and_the_model_section_is_transformer_config():
    config = default_config()
    assert TransformerConfig() == validate_config(RunConfig.from_config(synthetic_config()))
    assert config.model.dtype == "float32" and config.model.qk_dim is None
    assert (config.train.warmup_steps, config.train.label_smoothing) == (4000, 0.1)
    assert (config.decode.beam_size, config.decode.alpha) == (4, 0.6)
    config.model.qk_dim = 64  # an Optional field stays overridable as an int
    assert validate_config(RunConfig.from_config(config)).qk_dim == 64


def test_transformer_config_stays_a_frozen_hashable_dataclass_with_metadata():
    config = TransformerConfig(dtype="bfloat16")  # a dtype's name, as a config file has it
    assert config.dtype == jnp.bfloat16 and config == TransformerConfig(dtype=jnp.bfloat16)
    assert hash(config) == hash(TransformerConfig(dtype=jnp.bfloat16))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 8
    spec = fields.specs(TransformerConfig)["norm"][1]
    assert spec.check.rule == "one of ('post', 'pre')" and not spec.resumable


@pytest.mark.parametrize(
    "section, name, value, message",
    [  # one per kind of check
        (
            "train",
            "parallel",
            "mpi",
            "train.parallel must be one of ('pmap', 'shard_map', 'mesh'), got 'mpi'",
        ),
        ("train", "num_steps", 0, "train.num_steps must be a positive integer, got 0"),
        ("train", "prefetch", 1.5, "train.prefetch must be an integer >= 0, got 1.5"),
        ("train", "adam_b2", 1.0, "train.adam_b2 must be in [0, 1), got 1.0"),
        ("train", "adam_eps", 0.0, "train.adam_eps must be a number > 0, got 0.0"),
        ("decode", "alpha", -0.5, "decode.alpha must be a number >= 0, got -0.5"),
        ("decode", "alpha", float("inf"), "decode.alpha must be a finite number, got inf"),
        ("model", "qk_dim", 0, "model.qk_dim must be a positive integer or None, got 0"),
        ("model", "dtype", "int8", "model.dtype must be one of ('float32', 'bfloat16', 'float16')"),
        ("data", "packing", "yes", "data.packing must be True or False, got 'yes'"),
        ("data", "src_lang", 7, "data.src_lang must be a string, got 7"),
    ],
)
def test_each_kind_of_check_names_the_field_in_one_line(section, name, value, message):
    values = synthetic_config().to_dict()
    values[section][name] = value  # as a config file may write it (overrides keep the type)
    with pytest.raises(ValueError) as error:
        RunConfig.from_config(values)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_a_field_no_section_declares_is_refused():
    config = synthetic_config()
    config.train.num_step = 10  # a typo
    with pytest.raises(ValueError, match=r"^unknown config field train\.num_step "):
        validate_config(RunConfig.from_config(config))
    config = synthetic_config()
    config.optimizer = {"lr": 1.0}
    with pytest.raises(ValueError, match=r"^unknown config sections \['optimizer'\]"):
        validate_config(RunConfig.from_config(config))


def test_a_resume_may_change_the_fields_declared_resumable_and_no_others():
    assert "train.num_steps" in schema.RESUMABLE and "decode.alpha" in schema.RESUMABLE
    assert "data.text_dir" in schema.RESUMABLE
    assert "train.warmup_steps" not in schema.RESUMABLE
    assert not any(name.startswith("model.") for name in schema.RESUMABLE)
    declared = {
        f"{section}.{name}"
        for section, cls in SECTIONS.items()
        for name, (_, spec) in fields.specs(cls).items()
        if spec.resumable
    }
    assert set(schema.RESUMABLE) == declared


def test_help_text_lists_each_field_with_type_default_check_and_help():
    text = schema.help_text()
    for section, cls in SECTIONS.items():
        for name, (_, spec) in fields.specs(cls).items():
            assert f"  {section}.{name}: " in text and spec.help in text
    assert "  model.norm: str = 'post'; one of ('post', 'pre')" in text
    assert "  model.dtype: str = 'float32'; one of ('float32', 'bfloat16', 'float16')" in text
    assert "  model.qk_dim: int | None = None; a positive integer or None" in text
    assert "      steps between log lines [resumable]" in text


def test_train_help_shows_each_fields_default_and_help():
    result = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--help"],
        capture_output=True,
        text=True,
        cwd=str(ROOT),
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    at = lines.index("  train.warmup_steps: int = 4000; a positive integer")
    assert lines[at + 1] == "      the schedule's warmup (§5.3)"
    assert "  decode.beam_size: int = 4; a positive integer" in lines


def test_a_field_declared_without_setting_is_named():
    @dataclasses.dataclass(frozen=True)
    class Section:
        size: int = fields.setting(1, "a size", fields.integer(1))
        depth: int = 2

    with pytest.raises(TypeError, match=r"^Section\.depth: declare it with setting"):
        fields.specs(Section)


def test_config_json_of_the_defaults_is_what_the_config_dict_wrote():
    """The file a run writes is byte for byte the ConfigDict's ``to_json(indent=2)`` that
    earlier versions wrote: same keys in the same order, dtypes by name, placeholders null."""
    config = default_config()
    assert RunConfig.from_config(config).to_json() == config.to_json(indent=2)
    assert RunConfig().to_json() == config.to_json(indent=2)
    config.model.update(dtype="bfloat16", qk_dim=32, num_heads=16, final_norm=True)
    config.train.learning_rate_scale = 2  # a float field given an int, as a config file may
    run = RunConfig.from_config(config)
    assert run.model.dtype == jnp.bfloat16 and run.to_json() == config.to_json(indent=2)
    assert RunConfig.from_config(json.loads(run.to_json())) == run


def test_a_saved_config_lacking_fields_reads_them_as_their_defaults():
    saved = json.loads(RunConfig().to_json())
    del saved["model"]["num_kv_heads"], saved["train"]["weight_decay"]
    saved["train"]["num_steps"] = 7
    del saved["decode"]
    run = RunConfig.from_config(saved)
    assert (run.model.num_kv_heads, run.train.weight_decay, run.train.num_steps) == (None, 0.0, 7)
    assert run.decode == RunConfig().decode


def test_run_config_is_frozen_and_replace_checks_again():
    run = RunConfig.from_config(synthetic_config())
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.train = run.train
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.train.num_steps = 3
    shorter = run.replace(train={"num_steps": 3}, data=DataConfig(source="synthetic", seed=1))
    assert (shorter.train.num_steps, shorter.data.seed, run.train.num_steps) == (3, 1, 100_000)
    with pytest.raises(ValueError, match=r"^train\.cooldown_steps=5 must be at most "):
        shorter.replace(train={"cooldown_steps": 5})
    with pytest.raises(ValueError, match=r"^unknown config sections \['optimizer'\]"):
        run.replace(optimizer={})


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: RunConfig(train=dataclasses.replace(RunConfig().train, num_steps=0)),
         "train.num_steps must be a positive integer, got 0"),
        (lambda: RunConfig(data=DataConfig(max_len=64, tokens_per_batch=32)),
         "data.tokens_per_batch=32 must be >= data.max_len=64"),
        (lambda: RunConfig(data=DataConfig(max_len=1024)),
         "data.max_len=1024 must be <= model.max_len=512"),
        (lambda: RunConfig(model=TransformerConfig(vocab_size=100)),
         "model.vocab_size must be an integer >= 260"),
        (lambda: RunConfig.from_config({"data": {"source": "text"}}),
         "data.text_dir must be set for data.source='text'"),
        (lambda: RunConfig(data={"source": "synthetic"}),
         "RunConfig.data must be a DataConfig, got dict"),
    ],
)  # fmt: skip
def test_a_bad_run_config_is_refused_in_one_line_when_made(make, message):
    with pytest.raises((ValueError, TypeError)) as error:
        make()
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_only_the_commands_the_configs_and_the_schema_import_ml_collections():
    """Below the command line the run config is a RunConfig: no module of the library but
    ``cli/``, ``configs/`` (config files) and the schema (``default_config``, and
    ``RunConfig.from_config`` of a config file) imports ml_collections."""
    package = ROOT / "transformer_jax"
    allowed = {"training/schema.py"}
    found = set()
    for path in package.rglob("*.py"):
        relative = path.relative_to(package).as_posix()
        if relative.startswith(("cli/", "configs/")) or relative in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            if any(name.split(".")[0] == "ml_collections" for name in names):
                found.add(relative)
        if "ConfigDict" in path.read_text():
            found.add(relative)
    assert not found, sorted(found)
