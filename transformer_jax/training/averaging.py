"""Checkpoint averaging (paper §6.1: "averaging the last 5 checkpoints, which were written
at 10-minute intervals" for the base model, the last 20 for the big one): the element-wise
mean of a run's last checkpoints, saved as ``{workdir}/averaged``."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from transformer_jax.training.checkpoints import AVERAGED_DIR, list_steps, load_run, save_params
from transformer_jax.training.workdir import lock_workdir


def average_params(trees: Sequence[Any]) -> Any:
    """Element-wise mean of parameter pytrees (accumulated in float64, original dtypes)."""
    if not trees:
        raise ValueError("need at least one set of parameters to average")
    trees = [nn.unbox(tree) for tree in trees]  # model.init's boxes or plain arrays
    total = jax.tree.map(lambda x: np.asarray(x, np.float64), trees[0])
    for tree in trees[1:]:
        total = jax.tree.map(lambda t, x: t + np.asarray(x, np.float64), total, tree)
    return jax.tree.map(lambda t, x: (t / len(trees)).astype(np.asarray(x).dtype), total, trees[0])


def average_checkpoints(workdir: str, last: int) -> tuple[list[int], str]:
    """Average the last ``last`` checkpoints of ``workdir`` into ``{workdir}/averaged``
    (tagged with the newest step; ``load_run(workdir, 'averaged')`` reads it).

    Returns the averaged steps and the output directory; ValueError if there are fewer.
    """
    if not isinstance(last, int) or last < 1:
        raise ValueError(f"--last must be a positive integer, got {last!r}")
    if not os.path.isdir(workdir):
        raise ValueError(f"workdir {workdir!r} does not exist")
    steps = list_steps(workdir)
    if len(steps) < last:
        raise ValueError(
            f"--last {last} needs {last} checkpoints, {workdir!r} has {len(steps)}: {steps}"
        )
    steps = steps[-last:]
    directory = os.path.join(workdir, AVERAGED_DIR)
    with lock_workdir(workdir):  # not while train.py writes this workdir
        params = average_params([load_run(workdir, step)[1] for step in steps])
        shutil.rmtree(directory, ignore_errors=True)  # replace an earlier average
        save_params(directory, params, steps[-1])
    return steps, directory
