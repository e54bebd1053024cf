"""Checkpoints written before a parameter was renamed, read as today's trees.

One rename so far: each sub-layer's norm, auto-named by its class before (``*_block/LayerNorm_0``,
``*_block/RMSNorm_0``), is ``*_block/norm`` (the module named by its role, so that a norm
given by name or by module makes the same tree). :func:`upgrade` renames a tree that holds
parameters (the parameters, Adam's moments, a checkpoint's checksums by path);
:func:`readable` wraps an Orbax ``CheckpointManager`` so that every restore and item metadata
of an old checkpoint is upgraded, a restore's target laid out under the checkpoint's names
first. Saving is unchanged: checkpoints are written with today's names.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import orbax.checkpoint as ocp

_CLASS_NAMED = re.compile(r"[A-Z]\w*_0")  # Flax's name for a sub-layer's one unnamed module
_IN_PATH = re.compile(r"(_block'\])\['[A-Z]\w*_0'\]")  # the same in a path ('keystr')


def _renamed(parent: Any, key: Any) -> Any:
    """Today's name of ``key`` under ``parent``."""
    if isinstance(key, str) and isinstance(parent, str) and parent.endswith("_block"):
        return "norm" if _CLASS_NAMED.fullmatch(key) else key
    return _IN_PATH.sub(r"\1['norm']", key) if isinstance(key, str) else key


def upgrade(tree: Any, parent: Any = None) -> Any:
    """``tree`` with the parameter names of older versions renamed to today's (module doc);
    nested dicts, lists and tuples (named ones kept) are followed, other leaves kept."""
    if isinstance(tree, Mapping):
        return {_renamed(parent, k): upgrade(v, k) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(upgrade(x) for x in tree))
    if isinstance(tree, list | tuple):
        return type(tree)(upgrade(x) for x in tree)
    return tree


def saved_layout(template: Any, saved: Any, parent: Any = None) -> Any:
    """``template`` (today's names) with the names that ``saved`` (a checkpoint's tree, maybe
    older) uses for the same entries: what a restore of that checkpoint is given."""
    if isinstance(template, Mapping) and isinstance(saved, Mapping):
        names = {_renamed(parent, k): k for k in saved}
        return {
            names.get(k, k): saved_layout(v, saved.get(names.get(k, k)), k)
            for k, v in template.items()
        }
    if isinstance(template, tuple) and hasattr(template, "_fields"):  # Orbax saves a dict
        saved = saved._asdict() if hasattr(saved, "_asdict") else saved
        fields = saved_layout(template._asdict(), saved if isinstance(saved, Mapping) else {})
        return type(template)(**fields)
    if isinstance(template, list | tuple) and isinstance(saved, list | tuple):
        return type(template)(saved_layout(t, s) for t, s in zip(template, saved, strict=False))
    return template


class _Readable:
    """An Orbax ``CheckpointManager`` whose ``item_metadata`` and ``restore`` read old
    checkpoints under today's names; everything else is the manager's."""

    def __init__(self, manager: ocp.CheckpointManager) -> None:
        self._manager = manager

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)

    def item_metadata(self, step: int) -> dict[str, Any]:
        saved = self._manager.item_metadata(step)
        return {name: upgrade(getattr(value, "tree", value)) for name, value in saved.items()}

    def restore(self, step: int, args: ocp.args.Composite) -> dict[str, Any]:
        items, saved = dict(args.items()), None
        for name, arg in items.items():
            if isinstance(arg, ocp.args.StandardRestore) and arg.item is not None:
                saved = saved or self._manager.item_metadata(step)
                tree = getattr(saved.get(name), "tree", None)
                items[name] = dataclasses.replace(arg, item=saved_layout(arg.item, tree))
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        return {name: upgrade(restored[name]) for name in items}


def readable(manager: ocp.CheckpointManager) -> Any:
    """``manager``, reading checkpoints of older versions as today's trees (module doc)."""
    return _Readable(manager)
