"""``TrainConfig``: the ``train`` section of a run's config, each field declared once with its
default, check and help (:func:`transformer_jax.fields.setting`); the loss conventions and
the kinds of data parallelism it names.

Importing it imports no JAX: a command's ``--help`` and its config's checks read it before
the library is imported.
"""

from __future__ import annotations

import dataclasses

from transformer_jax.fields import FLAG, integer, number, one_of, predicate, setting

# train.label_smoothing_convention: transformer_jax.training.loss
CONVENTIONS = ("t2t", "uniform")
# train.parallel: transformer_jax.training.parallel ('mesh': training.mesh.MeshParallel)
PARALLEL_KINDS = ("pmap", "shard_map", "mesh")
# train.logical_axis_rules: a parameter's or activation's logical axis -> a mesh axis
MESH_AXES = ("data", "model")
DEFAULT_RULES = (
    "embed=data,vocab=model,heads=model,mlp=model,activation_batch=data,activation_vocab=model"
)


def parse_rules(text: str) -> tuple[tuple[str, str], ...]:
    """``'embed=data,vocab=model'`` as ``(('embed', 'data'), ('vocab', 'model'))``, the
    rules of ``nn.logical_axis_rules``; ValueError naming the field for a malformed one."""
    rules = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, axis = (x.strip() for x in item.partition("="))
        if not sep or not name or axis not in MESH_AXES or name in dict(rules):
            raise ValueError(
                f"train.logical_axis_rules: {item!r} is not LOGICAL=MESH_AXIS with a mesh axis "
                f"of {MESH_AXES}, each logical name once (e.g. 'embed=data,heads=model')"
            )
        rules.append((name, axis))
    return tuple(rules)


def _rules(value: object) -> bool:
    try:
        return isinstance(value, str) and parse_rules(value) is not None
    except ValueError:
        return False


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
    logical_axis_rules: str = setting(
        DEFAULT_RULES,
        "parallel='mesh': LOGICAL=MESH_AXIS pairs placing parameters and activations "
        "(mesh axes 'data', 'model'; names not listed stay whole)",
        predicate("comma-separated LOGICAL=MESH_AXIS pairs, MESH_AXIS 'data' or 'model'", _rules),
        resumable=True,
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
