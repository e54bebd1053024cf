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
"""

from __future__ import annotations

import dataclasses

import ml_collections

from transformer_jax.data.config import DataConfig
from transformer_jax.fields import FLAG, TEXT, check_values, specs
from transformer_jax.inference.config import DecodeConfig
from transformer_jax.kernels import fast_matmul_precision
from transformer_jax.model.config import TransformerConfig
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


def check_fields(config: ml_collections.ConfigDict) -> None:
    """ValueError naming the first field that no section declares or whose check refuses it."""
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
