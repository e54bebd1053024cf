"""The run config's schema: its sections, each field declared once (with its type, default,
check, whether a resumed run may change it and its one-line help) in the section's class.

Sections: ``model`` (:class:`transformer_jax.TransformerConfig`), ``data``
(:class:`transformer_jax.data.config.DataConfig`), ``train``
(:class:`transformer_jax.training.config.TrainConfig`) and ``decode``
(:class:`transformer_jax.inference.config.DecodeConfig`), each living with what it
configures. A field is one ``name: type = setting(default, help, check)`` line in its
section; :func:`default_config` (the ConfigDict that ``transformer_jax/configs/*.py`` start
from and ``--config.SECTION.FIELD=VALUE`` overrides), the validation, :data:`RESUMABLE` and
``train --help`` (:func:`help_text`) are read from these declarations. Defaults are the
paper's base model on WMT14 English->German (§5, §6.1). Importing it imports no JAX: a
command's ``--help`` and its config's field checks come before the library.

:class:`RunConfig` is the run's config below the command line: the four sections, frozen,
checked field by field and across fields when made (:meth:`RunConfig.from_config` from a
config file's ConfigDict or a ``config.json``); ``to_json`` is ``config.json``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import ml_collections

from transformer_jax.data.config import DataConfig
from transformer_jax.fields import FLAG, TEXT, check_values, specs
from transformer_jax.ids import PAD_ID, check_vocab_size
from transformer_jax.inference.config import DecodeConfig
from transformer_jax.kernels import fast_matmul_precision
from transformer_jax.model.config import DTYPE, TransformerConfig, dtype_name
from transformer_jax.training.config import TrainConfig

SECTIONS: dict[str, type] = {
    "model": TransformerConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "decode": DecodeConfig,
}
# The fields a resumed run may change: when and what it logs, saves and evaluates, how long it
# trains, how it decodes, where its data lives. Any other change makes another run.
RESUMABLE = tuple(
    f"{section}.{name}"
    for section, cls in SECTIONS.items()
    for name, (_, spec) in specs(cls).items()
    if spec.resumable
)


def _config_value(field: dataclasses.Field) -> object:
    """A field's default as a config file writes it: None as an int (or a ``bool | None``
    field's bool) placeholder (overridable from the command line)."""
    if field.default is None:
        kind = bool if str(field.type).startswith("bool") else int
        return ml_collections.config_dict.placeholder(kind)
    return field.default


def default_config() -> ml_collections.ConfigDict:
    """Every section's defaults: the paper's base model (§5, §6.1) on WMT14 English->German."""
    return ml_collections.ConfigDict(
        {
            section: {f.name: _config_value(f) for f in dataclasses.fields(cls)}
            for section, cls in SECTIONS.items()
        }
    )


def check_fields(config: Mapping[str, Any]) -> None:
    """ValueError naming the first field that no section declares or whose check refuses it
    (``config``: a config file's ConfigDict or a ``config.json``'s dict)."""
    unknown = sorted(set(config) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown config sections {unknown}; the sections: {list(SECTIONS)}")
    for section, cls in SECTIONS.items():
        values = config.get(section) or {}
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            names = ", ".join(f"{section}.{name}" for name in unknown)
            raise ValueError(f"unknown config field {names} (train --help lists the fields)")
        check_values(cls, values, f"{section}.")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A run's config: its ``model``, ``data``, ``train`` and ``decode`` sections, each field
    checked by its section's declaration and the sections checked against each other
    (:func:`check_rules`) when it is made. ``model`` holds the user's values ('auto' choices
    unresolved: ``resolve_auto`` makes them where the model is built)."""

    model: TransformerConfig = dataclasses.field(default_factory=TransformerConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)

    def __post_init__(self) -> None:
        for section, cls in SECTIONS.items():
            value = getattr(self, section)
            if not isinstance(value, cls):
                raise TypeError(
                    f"RunConfig.{section} must be a {cls.__name__}, got {type(value).__name__}"
                )
            check_values(cls, vars(value), f"{section}.")
        check_rules(self)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RunConfig:
        """The run config of ``config`` (a config file's ConfigDict, or the dict of a
        ``config.json``): a field it lacks takes its default; ValueError naming the first
        unknown or refused field."""
        values = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
        check_fields(values)
        return cls(**{s: c(**(values.get(s) or {})) for s, c in SECTIONS.items()})

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """``{section: {field: value}}`` in declaration order, as JSON writes them (a dtype by
        its name, an unset optional field as None)."""
        return {section: _as_json(getattr(self, section)) for section in SECTIONS}

    def to_json(self, indent: int | None = 2) -> str:
        """``config.json``'s text."""
        return json.dumps(self.to_dict(), indent=indent)

    def replace(self, **changes: Any) -> RunConfig:
        """This config with sections replaced: each change a section's instance or a dict of
        its fields' new values (checked again)."""
        unknown = sorted(set(changes) - set(SECTIONS))
        if unknown:
            raise ValueError(f"unknown config sections {unknown}; the sections: {list(SECTIONS)}")
        values = self.to_dict()
        for section, change in changes.items():
            values[section] |= _as_json(change) if dataclasses.is_dataclass(change) else change
        return RunConfig.from_config(values)


def _as_json(section: Any) -> dict[str, Any]:
    """A section's ``{field: value}`` as JSON writes it (a dtype by its name)."""
    return {
        name: dtype_name(value) if spec.check is DTYPE else value
        for name, (_, spec) in specs(type(section)).items()
        for value in [getattr(section, name)]
    }


def check_rules(config: RunConfig) -> None:
    """ValueError naming the fields of the first rule across fields that ``config`` breaks
    (the rules that depend on the host: ``training.validation``)."""
    model, data, train = config.model, config.data, config.train
    if train.cooldown_steps > train.num_steps:
        raise ValueError(
            f"train.cooldown_steps={train.cooldown_steps} must be at most "
            f"train.num_steps={train.num_steps}"
        )
    if data.source == "text" and not data.text_dir:
        raise ValueError("data.text_dir must be set for data.source='text'")
    if data.tokens_per_batch < data.max_len:
        raise ValueError(
            f"data.tokens_per_batch={data.tokens_per_batch} must be >= data.max_len={data.max_len}"
        )
    check_vocab_size(model.vocab_size)  # the run's tokenizer has at least that many pieces
    if model.pad_id != PAD_ID:
        raise ValueError(
            f"model.pad_id={model.pad_id} must be {PAD_ID}: the tokenizer and the batches "
            f"pad with id {PAD_ID}"
        )
    if model.attention_impl == "cudnn" and data.max_len % 8:
        raise ValueError(
            f"data.max_len={data.max_len} must be a multiple of 8 with "
            "model.attention_impl='cudnn' (cuDNN's sequence lengths; the buckets below it are)"
        )
    if data.max_len > model.max_len:
        raise ValueError(
            f"data.max_len={data.max_len} must be <= model.max_len={model.max_len} "
            "(the longest position the model encodes)"
        )


def help_text() -> str:
    """The config fields for ``--help``: each with its type, default, check and help."""
    lines = [
        "config fields (--config.SECTION.FIELD=VALUE; the default is the paper's base model's,",
        "which the config file may change; [resumable]: a resumed run may change it):",
    ]
    for section, cls in SECTIONS.items():
        for name, (field, spec) in specs(cls).items():
            value = _config_value(field)
            kind = type(value).__name__ if field.type == "Any" else field.type
            default = None if field.default is None else value
            rule = "" if spec.check in (FLAG, TEXT) else f"; {spec.check.rule}"  # the type says it
            lines.append(f"  {section}.{name}: {kind} = {default!r}{rule}")
            lines.append(f"      {spec.help}{' [resumable]' if spec.resumable else ''}")
    return "\n".join(lines)


def resolve_auto(model: TransformerConfig) -> TransformerConfig:
    """``model`` with the choices that depend on the host made for this one:
    ``matmul_precision='auto'`` is the target's fastest arithmetic
    (:func:`transformer_jax.kernels.fast_matmul_precision`)."""
    if model.matmul_precision != "auto":
        return model
    return model.replace(matmul_precision=fast_matmul_precision(model.platform))
