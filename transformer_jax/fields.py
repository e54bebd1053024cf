"""One declaration per config field: a dataclass field whose metadata holds its check, whether
a resumed run may change it and its one-line help (:func:`setting`).

The sections of a run's config are such dataclasses (``TransformerConfig`` for ``model``,
``DataConfig``, ``TrainConfig`` and ``DecodeConfig`` in the ``config`` module of ``data``,
``training`` and ``inference``; composed by ``training.schema``); their type, default, check
and help are read from here by the defaults, the validation, the resume rules and ``--help``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

SPEC = "transformer_jax"  # the metadata key of a field's Spec


@dataclasses.dataclass(frozen=True)
class Check:
    """What a good value is, in words (``rule``: "one of ('post', 'pre')") and as a test."""

    rule: str
    test: Callable[[Any], bool]

    def error(self, value: Any) -> str | None:
        """``'must be RULE'`` where ``value`` breaks the rule (a non-finite float always does)."""
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        return None if self.test(value) else f"must be {self.rule}"


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def one_of(*values: Any) -> Check:
    return Check(f"one of {values}", lambda value: value in values)


def integer(minimum: int) -> Check:
    """An integer >= ``minimum``."""
    rule = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    return Check(rule, lambda value: _integer(value) and value >= minimum)


def number(low: float, high: float | None = None, *, low_open: bool = False) -> Check:
    """A finite number from ``low`` (excluded if ``low_open``) below ``high`` (if given)."""
    if high is not None:
        rule = f"in {'(' if low_open else '['}{low}, {high})"
    else:
        rule = f"a number {'>' if low_open else '>='} {low}"

    def test(value: Any) -> bool:
        above = _number(value) and (value > low if low_open else value >= low)
        return above and (high is None or value < high)

    return Check(rule, test)


def optional(check: Check) -> Check:
    """``check``, or None."""
    return Check(f"{check.rule} or None", lambda value: value is None or check.test(value))


def predicate(rule: str, test: Callable[[Any], bool]) -> Check:
    return Check(rule, test)


FLAG = Check("True or False", lambda value: isinstance(value, bool))
TEXT = Check("a string", lambda value: isinstance(value, str))


@dataclasses.dataclass(frozen=True)
class Spec:
    """A field's check, whether a resumed run may change it, and its one-line help."""

    help: str
    check: Check
    resumable: bool = False


def setting(default: Any, help: str, check: Check, *, resumable: bool = False) -> Any:
    """A config field: ``name: type = setting(default, help, check)``."""
    return dataclasses.field(default=default, metadata={SPEC: Spec(help, check, resumable)})


def specs(section: type) -> dict[str, tuple[dataclasses.Field, Spec]]:
    """``{name: (field, spec)}`` of a section's fields, in their order; TypeError naming a
    field declared without :func:`setting`."""
    found = {}
    for f in dataclasses.fields(section):
        if SPEC not in f.metadata:
            raise TypeError(f"{section.__name__}.{f.name}: declare it with setting(default, ...)")
        found[f.name] = (f, f.metadata[SPEC])
    return found


def check_values(section: type, values: Mapping[str, Any], prefix: str = "") -> None:
    """ValueError naming ``{prefix}{field}`` for the first of ``values`` its check refuses."""
    for name, (_, spec) in specs(section).items():
        if name in values and (error := spec.check.error(values[name])):
            raise ValueError(f"{prefix}{name} {error}, got {values[name]!r}")


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's nested sections as ``{'section.field': value}`` (its JSON form)."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
