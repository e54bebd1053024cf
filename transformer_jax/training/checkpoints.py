"""Orbax checkpoints of a training run, and loading trained parameters back.

``{workdir}/checkpoints/{step}/`` holds three items: ``params``; ``train`` (optimizer
state, step and base dropout key); ``data`` (the training iterator position, JSON).
Orbax writes each step into a temporary directory and renames it when complete, so a
run killed mid-save leaves its previous checkpoints intact; a checkpoint that still
fails to restore is reported and the one before it is used.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp

from transformer_jax.training.steps import TrainState

CHECKPOINT_DIR = "checkpoints"
AVERAGED_DIR = "averaged"
SNAPSHOT_DIR = "snapshots"
CONFIG_FILE = "config.json"

log = logging.getLogger(__name__)


def _train_items(state: TrainState) -> dict[str, Any]:
    """What a checkpoint's ``train`` item holds of the train state."""
    return {"step": state.step, "opt_state": state.opt_state, "rng": state.rng}


def _manager(directory: str, keep: int | None = None, create: bool = True) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=create, enable_async_checkpointing=True
    )
    return ocp.CheckpointManager(os.path.abspath(directory), options=options)


class Checkpointer:
    """Periodic, asynchronous checkpoints of the train state (keeps the last ``keep``)."""

    def __init__(self, workdir: str, keep: int):
        self.directory = os.path.join(workdir, CHECKPOINT_DIR)
        self.manager = _manager(self.directory, keep)

    def save(self, step: int, params: Any, train: dict[str, Any], data: dict[str, Any]) -> None:
        """Start saving host arrays ``params`` and ``train`` and the JSON ``data`` at ``step``."""
        self.manager.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                train=ocp.args.StandardSave(train),
                data=ocp.args.JsonSave(data),
            ),
            force=True,
        )

    def save_state(self, state: TrainState, data: dict[str, Any]) -> None:
        """Start saving the host train state ``state`` and the data iterator position."""
        self.save(int(state.step), state.params, _train_items(state), data)

    def restore_state(self, state: TrainState) -> tuple[TrainState, dict] | None:
        """``(state, data)`` of the newest checkpoint that restores, else None; ``state``
        is a host train state giving the structure and dtypes."""
        restored = self.restore_latest(state.params, _train_items(state))
        if restored is None:
            return None
        _, params, train, data = restored
        return state.replace(params=params, **train), data

    def restore_latest(
        self, params: Any, train: dict[str, Any]
    ) -> tuple[int, Any, dict, dict] | None:
        """``(step, params, train, data)`` of the newest checkpoint that restores, else None.

        ``params`` and ``train`` are host pytrees giving the structure and dtypes.
        """
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                restored = self.manager.restore(
                    step,
                    args=ocp.args.Composite(
                        params=ocp.args.StandardRestore(params),
                        train=ocp.args.StandardRestore(train),
                        data=ocp.args.JsonRestore(),
                    ),
                )
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint: try the previous
                self._set_aside(step, e)
                continue
            return step, restored["params"], restored["train"], restored["data"]
        return None

    def _set_aside(self, step: int, error: Exception) -> None:
        """Rename an unreadable step to ``{step}.unreadable`` so it is neither used nor
        overwritten, and say so."""
        path = os.path.join(self.directory, str(step))
        aside = f"{path}.unreadable"
        if jax.process_index() == 0 and os.path.isdir(path) and not os.path.exists(aside):
            os.rename(path, aside)
        self.manager.reload()
        log.warning("checkpoint %d in %s is unreadable (%s)", step, self.directory, error)
        print(
            f"warning: checkpoint {step} is unreadable ({type(error).__name__}); moved to "
            f"{aside}, trying the previous one"
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def close(self) -> None:
        """Wait for pending saves and release the manager (once; later calls do nothing)."""
        if self.manager is not None:
            self.manager.wait_until_finished()
            self.manager.close()
            self.manager = None


def list_steps(workdir: str, kind: str = CHECKPOINT_DIR) -> list[int]:
    """Steps of the complete checkpoints in ``{workdir}/{kind}`` (``checkpoints`` or
    ``snapshots``), ascending."""
    directory = os.path.join(workdir, kind)
    if not os.path.isdir(directory):
        raise ValueError(f"no {kind} in {workdir!r}: {directory} does not exist")
    manager = _manager(directory, create=False)
    steps = sorted(manager.all_steps())
    manager.close()
    return steps


def save_params(directory: str, params: Any, step: int) -> None:
    """Write ``params`` alone as a checkpoint at ``step`` in ``directory`` (e.g. averaged/)."""
    manager = _manager(directory)
    manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params)), force=True)
    manager.wait_until_finished()
    manager.close()


def _restore_params(directory: str, step: int | None) -> tuple[Any, int]:
    if not os.path.isdir(directory):
        raise ValueError(f"no checkpoint directory {directory!r}")
    manager = _manager(directory, create=False)
    try:
        steps = sorted(manager.all_steps())
        if not steps:
            raise ValueError(f"no complete checkpoint in {directory!r}")
        if step is None:
            step = steps[-1]
        elif step not in steps:
            raise ValueError(f"checkpoint={step} not in {directory!r}; available steps: {steps}")
        restored = manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
    finally:
        manager.close()
    return restored["params"], step


def load_config(workdir: str) -> ml_collections.ConfigDict:
    """The resolved run config saved by ``train.py`` in ``{workdir}/config.json``."""
    path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise ValueError(f"{workdir!r} is not a training workdir: {path} is missing")
    with open(path) as f:
        return ml_collections.ConfigDict(json.load(f))


def parse_checkpoint(checkpoint: str | int) -> str | int:
    """Check a checkpoint name: ``'latest'``, ``'averaged'``, a step number (int or digits)
    or ``'snapshots/STEP'``; digits become an int. ValueError otherwise."""
    if isinstance(checkpoint, str) and checkpoint.isdigit():
        return int(checkpoint)
    if checkpoint in ("latest", "averaged") or isinstance(checkpoint, int):
        return checkpoint
    kind, _, step = str(checkpoint).partition("/")
    if kind == SNAPSHOT_DIR and step.isdigit():
        return checkpoint
    raise ValueError(
        "checkpoint must be 'latest', 'averaged', a step number or 'snapshots/STEP', "
        f"got {checkpoint!r}"
    )


def load_run(
    workdir: str, checkpoint: str | int = "latest"
) -> tuple[ml_collections.ConfigDict, Any, int]:
    """``(config, params, step)`` of a run: the ``'latest'`` checkpoint, a step number, the
    ``'averaged'`` parameters written by ``transformer_jax.average``, or
    ``'snapshots/STEP'``, parameters saved on SIGUSR1 (see ``training.loop``)."""
    checkpoint = parse_checkpoint(checkpoint)
    config = load_config(workdir)
    if checkpoint == "averaged":
        params, step = _restore_params(os.path.join(workdir, AVERAGED_DIR), None)
    elif checkpoint == "latest" or isinstance(checkpoint, int):
        step = None if checkpoint == "latest" else checkpoint
        params, step = _restore_params(os.path.join(workdir, CHECKPOINT_DIR), step)
    else:
        step = int(checkpoint.partition("/")[2])
        params, step = _restore_params(os.path.join(workdir, SNAPSHOT_DIR), step)
    return config, params, step
