"""The run config's schema: each field of each section declared once, with its type, default,
check, whether a resumed run may change it and its one-line help.

Sections: ``model`` (:class:`transformer_jax.TransformerConfig`), ``data``, ``train`` and
``decode`` (below). A field is one ``name: type = setting(default, help, check)`` line in its
section; :func:`default_config` (the ConfigDict that ``transformer_jax/configs/*.py`` start
from and ``--config.SECTION.FIELD=VALUE`` overrides), the validation, :data:`RESUMABLE` and
``train --help`` (:func:`help_text`) are read from these declarations. Defaults are the
paper's base model on WMT14 English->German (§5, §6.1).
"""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np

from transformer_jax.data.sources import SOURCES
from transformer_jax.fields import (
    FLAG,
    TEXT,
    check_values,
    integer,
    number,
    one_of,
    setting,
    specs,
)
from transformer_jax.kernels import fast_matmul_precision
from transformer_jax.model.config import TransformerConfig
from transformer_jax.training.loss import CONVENTIONS
from transformer_jax.training.parallel import PARALLEL_KINDS


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """``config.data``: where the pairs come from and how they are batched."""

    source: str = setting(
        "tfds", "'tfds', 'text' or 'synthetic' (the embedded task)", one_of(*SOURCES)
    )
    tfds_name: str = setting("wmt14_translate/de-en", "the TFDS dataset (source='tfds')", TEXT)
    src_lang: str = setting("en", "the source language's code", TEXT)
    tgt_lang: str = setting("de", "the target language's code", TEXT)
    text_dir: str = setting(
        "", "source='text': {text_dir}/{split}.{lang}[.gz]", TEXT, resumable=True
    )
    tfds_data_dir: str = setting(
        "", "source='tfds': the prepared data ('': TFDS's default)", TEXT, resumable=True
    )
    data_dir: str = setting(
        "", "the prepared (binarized) splits ('': {workdir}/data_cache)", TEXT, resumable=True
    )
    train_split: str = setting("train", "the split trained on", TEXT)
    eval_split: str = setting("validation", "the split of the dev loss and BLEU", TEXT)
    test_split: str = setting("test", "the split of the final test (train.final_test)", TEXT)
    tokenizer_train_sentences: int = setting(
        2_000_000, "sentences the BPE tokenizer is trained on", integer(1)
    )
    prepare_workers: int = setting(
        0,
        "processes that encode the splits and sample BPE-dropout's epochs (0: one per core)",
        integer(0),
        resumable=True,
    )
    max_len: int = setting(256, "longer pairs (in tokens) are dropped and counted", integer(1))
    tokens_per_batch: int = setting(
        25000, "source (and as many target) tokens per step over all devices (§5.1)", integer(1)
    )
    packing: bool = setting(False, "False: bucket by length; True: pack pairs into rows", FLAG)
    bpe_dropout: float = setting(
        0.0, "> 0: sources under BPE-dropout each epoch (not in the paper)", number(0, 1)
    )
    seed: int = setting(0, "the order of the pairs", integer(0))


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """``config.train``: the optimizer, the schedule and when the run logs, saves, evaluates."""

    num_steps: int = setting(
        100_000, "updates (base: 100k, big: 300k; §5.2)", integer(1), resumable=True
    )
    warmup_steps: int = setting(4000, "the schedule's warmup (§5.3)", integer(1))
    learning_rate_scale: float = setting(
        1.0, "factor on the schedule's rate", number(0, low_open=True)
    )
    cooldown_steps: int = setting(
        0, "> 0: the rate falls linearly to 0 over the last this many steps", integer(0)
    )
    adam_b1: float = setting(0.9, "Adam's beta_1 (§5.3)", number(0, 1))
    adam_b2: float = setting(0.98, "Adam's beta_2 (§5.3)", number(0, 1))
    adam_eps: float = setting(1e-9, "Adam's epsilon (§5.3)", number(0, low_open=True))
    weight_decay: float = setting(
        0.0, "> 0: AdamW's decoupled decay of the matrices (not in the paper)", number(0)
    )
    label_smoothing: float = setting(0.1, "epsilon_ls (§5.4)", number(0, 1))
    label_smoothing_convention: str = setting(
        "t2t",
        "'t2t': eps/(V-1) on the other tokens (paper's code); 'uniform': eps/V",
        one_of(*CONVENTIONS),
    )
    grad_accum_steps: int = setting(1, "batches whose gradients make one update", integer(1))
    prefetch: int = setting(
        2,
        "steps of batches a thread reads and places ahead (0: inline)",
        integer(0),
        resumable=True,
    )
    parallel: str = setting(
        "pmap",
        "'pmap' or 'shard_map' (replicated parameters) or 'mesh' (sharded over data x model)",
        one_of(*PARALLEL_KINDS),
        resumable=True,
    )
    mesh_model: int = setting(
        1, "parallel='mesh': the size of the mesh's model axis", integer(1), resumable=True
    )
    seed: int = setting(0, "the parameters' initialization and dropout", integer(0))
    log_every: int = setting(100, "steps between log lines", integer(1), resumable=True)
    eval_every: int = setting(
        5000, "steps between dev evaluations (0: at the end only)", integer(0), resumable=True
    )
    eval_sentences: int = setting(
        500, "dev sentences decoded for BLEU at an evaluation", integer(0), resumable=True
    )
    checkpoint_every: int = setting(
        5000, "steps between checkpoints (0: at the end only)", integer(0), resumable=True
    )
    keep_checkpoints: int = setting(
        20, "checkpoints kept (the paper averaged 5 base, 20 big)", integer(1), resumable=True
    )
    final_test: bool = setting(
        True, "loss and BLEU on data.test_split after training", FLAG, resumable=True
    )
    test_sentences: int = setting(
        0, "test pairs translated for BLEU at the end (0: all)", integer(0), resumable=True
    )
    samples: int = setting(
        5, "test translations printed at the end of training", integer(0), resumable=True
    )


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """``config.decode``: beam search (§6.1)."""

    beam_size: int = setting(4, "beams (§6.1)", integer(1), resumable=True)
    alpha: float = setting(0.6, "length penalty (§6.1)", number(0), resumable=True)
    max_extra_len: int = setting(
        50, "maximum output length = input length + this", integer(0), resumable=True
    )


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
    """A field's default as a config file writes it: a dtype by name, None as an int (or a
    ``bool | None`` field's bool) placeholder (overridable from the command line)."""
    if field.default is None:
        kind = bool if str(field.type).startswith("bool") else int
        return ml_collections.config_dict.placeholder(kind)
    if isinstance(field.default, type):
        return np.dtype(field.default).name
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
