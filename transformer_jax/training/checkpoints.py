"""Orbax checkpoints of a training run, and loading trained parameters back.

``{workdir}/checkpoints/{step}/`` holds four items: ``params``; ``train`` (optimizer
state, step and base dropout key); ``data`` (the training iterator position, JSON);
``checksums`` (the CRC-32 of every array, JSON). Orbax writes each step into a temporary
directory and renames it when complete, so a run killed mid-save leaves its previous
checkpoints intact; a checkpoint that still fails to restore, or to match its checksums,
is set aside and the one before it is used (see :class:`Checkpointer`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any

import flax.linen as nn
import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from transformer_jax.model.transformer import parameter_shapes
from transformer_jax.multihost.distributed import any_process
from transformer_jax.training.integrity import (
    abandoned_reads,
    checksums,
    difference,
    non_finite,
    shapes,
    verify,
)
from transformer_jax.training.schema import RunConfig, resolve_auto
from transformer_jax.training.steps import TrainState
from transformer_jax.training.upgrade import readable

CHECKPOINT_DIR = "checkpoints"
AVERAGED_DIR = "averaged"
SNAPSHOT_DIR = "snapshots"
CONFIG_FILE = "config.json"
UNFINISHED = ".orbax-checkpoint-tmp"  # Orbax's suffix of a step's save until it completes


def _train_items(state: TrainState) -> dict[str, Any]:
    """What a checkpoint's ``train`` item holds of the train state."""
    return {"step": state.step, "opt_state": state.opt_state, "rng": state.rng}


def _manager(directory: str, keep: int | None = None, create: bool = True) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=create, enable_async_checkpointing=True
    )
    return readable(ocp.CheckpointManager(os.path.abspath(directory), options=options))


class CheckpointMismatch(ValueError):
    """A checkpoint holds a different model or optimizer than the config describes."""


class Checkpointer:
    """Periodic, asynchronous checkpoints of the train state (keeps the last ``keep``).

    Only finite parameters are saved, each with the CRC-32 of its arrays (item
    ``checksums``); restoring checks the arrays' structure and shapes first (a mismatch is
    the config's fault and is raised, nothing is touched) and the checksums after (a
    mismatch, like any read error, makes the checkpoint unreadable: it is set aside and the
    one before it is used).
    """

    def __init__(self, workdir: str, keep: int):
        self.directory = os.path.join(workdir, CHECKPOINT_DIR)
        if jax.process_index() == 0:
            remove_unfinished(self.directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=True
        )
        handlers = {
            "params": ocp.StandardCheckpointHandler(),
            "train": ocp.StandardCheckpointHandler(),
            "data": ocp.JsonCheckpointHandler(),
            "checksums": ocp.JsonCheckpointHandler(),
        }  # named, so that item metadata is readable before a restore
        self.manager = ocp.CheckpointManager(
            os.path.abspath(self.directory), options=options, item_handlers=handlers
        )
        self.manager = readable(self.manager)  # older checkpoints restore as today's trees
        self.saving: int | None = None

    def save_state(self, state: TrainState, data: dict[str, Any]) -> None:
        """Start saving the host train state ``state`` and the data iterator position.

        FloatingPointError, naming the step and the newest saved checkpoint, if a parameter
        is not finite.
        """
        step = int(state.step)
        bad = non_finite(state.params)
        if bad:
            raise FloatingPointError(
                f"the parameters after step {step} are not finite ({bad[0]}"
                f"{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}); not saved. "
                f"{self.describe_newest()}"
            )
        self.wait()  # the previous save's errors are its own; from here on, this step's
        self.saving = step
        train = _train_items(state)
        args = ocp.args.Composite(
            params=ocp.args.StandardSave(state.params),
            train=ocp.args.StandardSave(train),
            data=ocp.args.JsonSave(data),
            checksums=ocp.args.JsonSave(
                {"params": checksums(state.params), "train": checksums(train)}
            ),
        )
        try:
            self.manager.save(step, args=args, force=True)
        except Exception as e:  # noqa: BLE001 - whatever the writer threads raised
            raise self._failed(e) from None

    def check(self) -> None:
        """Raise OSError at once if the last asynchronous save failed."""
        try:
            self.manager.check_for_errors()
        except Exception as e:  # noqa: BLE001 - whatever the writer thread raised
            raise self._failed(e) from None

    def _failed(self, error: Exception) -> OSError:
        return OSError(
            f"saving checkpoint {self.saving} in {self.directory} failed: {_reason(error)}"
        )

    def describe_newest(self) -> str:
        """Where the newest checkpoint verified at save (finite, checksummed) is, in words."""
        self.manager.wait_until_finished()
        for step in sorted(self.manager.all_steps(), reverse=True):
            if os.path.isdir(os.path.join(self.directory, str(step), "checksums")):
                return f"The newest finite checkpoint is step {step} in {self.directory}."
        return f"No finite checkpoint is saved in {self.directory}."

    def restore_state(self, state: TrainState) -> tuple[TrainState, dict] | None:
        """``(state, data)`` of the newest checkpoint that restores and matches its
        checksums, else None; ``state`` is a host train state giving structure and dtypes.

        CheckpointMismatch if the newest readable checkpoint holds other arrays than ``state``.
        """
        template = {"params": state.params, "train": _train_items(state)}
        for step in sorted(self.manager.all_steps(), reverse=True):
            error = None
            try:
                with abandoned_reads(os.path.join(self.directory, str(step))):
                    self._checkshapes(step, template)
                    restored = self.manager.restore(
                        step,
                        args=ocp.args.Composite(
                            params=ocp.args.StandardRestore(state.params),
                            train=ocp.args.StandardRestore(template["train"]),
                            data=ocp.args.JsonRestore(),
                        ),
                    )
                self._verify(step, {"params": restored["params"], "train": restored["train"]})
            except CheckpointMismatch:
                raise
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint: try the previous
                error = e
            (unreadable,) = any_process([error is not None])()  # all processes take one step
            if unreadable:
                self._set_aside(step, error)
                continue
            return state.replace(params=restored["params"], **restored["train"]), restored["data"]
        return None

    def _checkshapes(self, step: int, template: dict[str, Any]) -> None:
        metadata = self.manager.item_metadata(step)
        for name in ("params", "train"):
            if metadata.get(name) is None:
                raise ValueError(f"item {name!r} is missing")
            saved, expected = shapes(metadata[name]), shapes(template[name])
            if name == "train":  # optimizer states: compared as shapes, their names may differ
                saved = dict(enumerate(sorted(saved.values())))
                expected = dict(enumerate(sorted(expected.values())))
            if saved != expected:
                raise CheckpointMismatch(
                    f"checkpoint {step} in {self.directory} holds other {name} arrays than "
                    f"the config describes ({difference(saved, expected)})"
                )

    def _verify(self, step: int, restored: dict[str, Any]) -> None:
        path = os.path.join(self.directory, str(step), "checksums")
        if not os.path.isdir(path):
            return  # written before checksums were kept
        saved = self.manager.restore(
            step, args=ocp.args.Composite(checksums=ocp.args.JsonRestore())
        )["checksums"]
        verify(saved, restored)

    def _set_aside(self, step: int, error: Exception | None) -> None:
        """Rename an unreadable step to a free ``{step}.unreadable[.N]`` so that it is neither
        used nor overwritten, and say exactly what was done (``error`` None: another process
        could not read it). Every process calls it; all see the rename when it returns."""
        path = os.path.join(self.directory, str(step))
        aside, n = f"{path}.unreadable", 1
        while os.path.exists(aside):
            aside, n = f"{path}.unreadable.{n}", n + 1
        if error is None:
            reason = "on another process"
        else:
            reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        if jax.process_index() != 0:
            done = "process 0 sets it aside"
        else:
            try:
                os.rename(path, aside)
                done = f"moved it to {aside}"
            except OSError as e:
                done = f"could not move it aside ({e.strerror})"
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"checkpoint {step} set aside")
        self.manager.reload()
        print(
            f"warning: checkpoint {step} in {self.directory} is unreadable ({reason[:300]}); "
            f"{done}; trying the previous one"
        )

    def wait(self) -> None:
        """Wait for the pending asynchronous save (another save may not overlap it: under
        several processes their barriers would clash); OSError if it failed."""
        try:
            self.manager.wait_until_finished()
            self.manager.check_for_errors()
        except Exception as e:  # noqa: BLE001 - whatever the writer thread raised
            raise self._failed(e) from None

    def close(self) -> None:
        """Wait for pending saves and release the manager (once; later calls do nothing);
        OSError if the last save failed."""
        if self.manager is None:
            return
        try:
            self.wait()
        finally:
            self.manager.close()
            self.manager = None


def remove_unfinished(directory: str) -> None:
    """Remove the saves in ``directory`` that never completed (``{step}.orbax-checkpoint-tmp*``,
    left by a run killed mid-save), a line for each; a complete checkpoint is not touched."""
    if not os.path.isdir(directory):
        return
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        step, mark, _ = name.partition(UNFINISHED)
        if mark and step.isdigit() and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
            print(f"removed the unfinished save of step {step}: {path}")


def _reason(error: BaseException) -> str:
    """The OS's reason for ``error`` (an OSError it was raised from: "No space left on
    device"), else its first line, its middle cut if long (the end often names the cause)."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            where = f" ({cause.filename})" if cause.filename else ""
            return f"{type(cause).__name__}: {cause.strerror}{where}"
        cause = cause.__cause__ or cause.__context__
    first = str(error).splitlines()[0] if str(error) else ""
    if len(first) > 600:
        first = f"{first[:200]} ... {first[-400:]}"
    return f"{type(error).__name__}: {first}"


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
    """Write ``params`` alone, with their CRC-32s, as a checkpoint at ``step`` in
    ``directory`` (``averaged/``, ``snapshots/``); ``model.init``'s boxed parameters are
    written as their plain arrays."""
    params = nn.unbox(params)
    manager = _manager(directory)
    args = ocp.args.Composite(
        params=ocp.args.StandardSave(params),
        checksums=ocp.args.JsonSave({"params": checksums(params)}),
    )
    manager.save(step, args=args, force=True)
    manager.wait_until_finished()
    manager.close()


def _read_params(manager: ocp.CheckpointManager, step: int, expected: dict | None) -> Any:
    """The parameters of checkpoint ``step``, checked against their saved CRC-32s and, where
    ``expected`` (shapes by path) is given, their shapes; ValueError saying what is wrong."""
    path = os.path.join(manager.directory, str(step))
    items = {"params": ocp.args.StandardRestore()}
    if os.path.isdir(os.path.join(path, "checksums")):  # absent: written before they were kept
        items["checksums"] = ocp.args.JsonRestore()
    with abandoned_reads(path):
        restored = manager.restore(step, args=ocp.args.Composite(**items))
    if expected is not None and shapes(restored["params"]) != expected:
        raise CheckpointMismatch(
            f"checkpoint {step} in {manager.directory} holds other params arrays than "
            f"config.json describes ({difference(shapes(restored['params']), expected)})"
        )
    if "checksums" in items:
        verify({"params": restored["checksums"]["params"]}, {"params": restored["params"]})
    bad = non_finite(restored["params"])
    if bad:
        raise ValueError(f"{bad[0]} is not finite")
    return restored["params"]


def _restore_params(directory: str, step: int | None, expected: dict | None) -> tuple[Any, int]:
    """Verified parameters (:func:`_read_params`) of checkpoint ``step`` in ``directory``, or
    of its newest one that verifies when ``step`` is None (one warning line per damaged one
    skipped); ValueError naming the step if a named one is damaged, or if none verifies."""
    if not os.path.isdir(directory):
        raise ValueError(f"no checkpoint directory {directory!r}")
    manager = _manager(directory, create=False)
    try:
        steps = sorted(manager.all_steps())
        if not steps:
            raise ValueError(f"no complete checkpoint in {directory!r}")
        if step is not None and step not in steps:
            raise ValueError(f"checkpoint={step} not in {directory!r}; available steps: {steps}")
        candidates = [step] if step is not None else steps[::-1]
        for candidate in candidates:
            try:
                return _read_params(manager, candidate, expected), candidate
            except CheckpointMismatch:
                raise
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint is damaged
                reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                damaged = f"checkpoint {candidate} in {directory} is damaged ({reason[:300]})"
                if candidate == candidates[-1]:
                    earlier = "" if step is not None else " and no earlier one verifies"
                    raise ValueError(f"{damaged}{earlier}; not used") from None
                print(f"warning: {damaged}; trying the previous one", file=sys.stderr)
    finally:
        manager.close()


def load_config(workdir: str) -> RunConfig:
    """The run config saved by ``train.py`` in ``{workdir}/config.json`` (a field it lacks,
    saved before the field existed, takes its default); ValueError naming the file if it
    cannot be read or a field is refused."""
    path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise ValueError(f"{workdir!r} is not a training workdir: {path} is missing")
    try:
        with open(path) as f:
            return RunConfig.from_config(json.load(f))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


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


def load_run(workdir: str, checkpoint: str | int = "latest") -> tuple[RunConfig, Any, int]:
    """``(config, params, step)`` of a run: the ``'latest'`` checkpoint, a step number, the
    ``'averaged'`` parameters written by ``transformer_jax.average``, or
    ``'snapshots/STEP'``, parameters saved on SIGUSR1 (see ``training.loop``).

    The parameters are checked against the shapes ``config.json`` describes and the CRC-32s
    saved with them: a damaged checkpoint named by step is refused (ValueError); for
    ``'latest'`` the newest one that verifies is used, with a warning line for each skipped.
    """
    checkpoint = parse_checkpoint(checkpoint)
    config = load_config(workdir)
    expected = shapes(parameter_shapes(resolve_auto(config.model)))
    if checkpoint == "averaged":
        directory, step = os.path.join(workdir, AVERAGED_DIR), None
    elif checkpoint == "latest" or isinstance(checkpoint, int):
        step = None if checkpoint == "latest" else checkpoint
        directory = os.path.join(workdir, CHECKPOINT_DIR)
    else:
        step = int(checkpoint.partition("/")[2])
        directory = os.path.join(workdir, SNAPSHOT_DIR)
    params, step = _restore_params(directory, step, expected)
    return config, params, step
