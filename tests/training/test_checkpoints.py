"""training.checkpoints: the last ``keep`` checkpoints are kept, older ones pruned; a failed
restore is set aside without the noise of the reads it abandons."""

import logging
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.training.checkpoints import Checkpointer, list_steps
from transformer_jax.training.optimizer import transformer_optimizer, transformer_schedule
from transformer_jax.training.steps import create_train_state


def _state(params):
    tx = transformer_optimizer(transformer_schedule(16, 10))
    return jax.device_get(create_train_state(params, tx, jax.random.PRNGKey(0)))


def test_keeps_the_last_k_checkpoints(tmp_path):
    params = {"w": jnp.arange(3.0), "b": jnp.zeros((2, 2))}
    state = _state(params)
    checkpointer = Checkpointer(str(tmp_path), keep=3)
    for step in range(1, 7):
        state = state.replace(
            step=np.array(step, np.int32), params={**params, "w": params["w"] + step}
        )
        checkpointer.save_state(state, {"epoch": 0, "position": step})
        if step == 3:
            checkpointer.manager.wait_until_finished()
            assert list_steps(str(tmp_path)) == [1, 2, 3]  # nothing pruned below K
    checkpointer.close()
    assert list_steps(str(tmp_path)) == [4, 5, 6]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["4", "5", "6"]

    restored, data = Checkpointer(str(tmp_path), keep=3).restore_state(state)
    assert int(restored.step) == 6 and data == {"epoch": 0, "position": 6}
    np.testing.assert_array_equal(restored.params["w"], np.arange(3.0) + 6)


class _Raises:
    """An object whose collection raises ``error`` into ``sys.unraisablehook``."""

    def __init__(self, error):
        self.error = error

    def __del__(self):
        raise self.error


def test_a_read_failing_while_restore_raises_is_dropped_and_others_pass(tmp_path, monkeypatch):
    state = _state({"w": jnp.arange(3.0)})
    checkpointer = Checkpointer(str(tmp_path), keep=3)
    checkpointer.save_state(state.replace(step=np.array(4, np.int32)), {"position": 4})
    checkpointer.manager.wait_until_finished()
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(str(u.exc_value)))

    def restore(*args, **kwargs):  # orbax's loop closes on a read error; another read ends
        _Raises(RuntimeError("Event loop is closed"))
        _Raises(RuntimeError("some other error"))
        raise OSError("truncated array")

    monkeypatch.setattr(checkpointer.manager, "restore", restore)
    hook, filters = sys.unraisablehook, list(logging.getLogger("asyncio").filters)
    assert checkpointer.restore_state(state) is None
    assert seen == ["some other error"]
    assert sys.unraisablehook is hook and logging.getLogger("asyncio").filters == filters
    _Raises(RuntimeError("Event loop is closed"))  # outside a restore: passed on
    assert seen == ["some other error", "Event loop is closed"]
    assert (tmp_path / "checkpoints" / "4.unreadable").is_dir()
    checkpointer.close()


@pytest.mark.parametrize("shape", ["raised from the OS error", "one long line"])
def test_a_failed_save_names_the_os_reason_however_long_the_error(tmp_path, monkeypatch, shape):
    checkpointer = Checkpointer(str(tmp_path), keep=3)
    long = "Error writing local file " + "/very/long/path" * 40

    def save(*args, **kwargs):
        if shape == "one long line":  # the OS's reason only at the end
            raise ValueError(f"{long} [OS error 28: No space left on device]")
        raise ValueError(long) from OSError(28, "No space left on device", "/full/x")

    monkeypatch.setattr(checkpointer.manager, "save", save)
    with pytest.raises(OSError, match="saving checkpoint .* No space left on device") as e:
        checkpointer.save_state(_state({"w": jnp.arange(3.0)}), {"position": 0})
    assert len(str(e.value)) < 800 and "\n" not in str(e.value)
    assert shape == "one long line" or str(e.value).endswith("(/full/x)")


def test_a_save_that_fails_names_its_own_step_not_the_previous_one(tmp_path, monkeypatch):
    """Another process lost while step 40 is saved: the error names 40, not the last saved."""
    state = _state({"w": jnp.arange(3.0)})
    checkpointer = Checkpointer(str(tmp_path), keep=3)
    checkpointer.save_state(state.replace(step=np.array(20, np.int32)), {"position": 20})

    def save(*args, **kwargs):
        raise RuntimeError("DEADLINE_EXCEEDED: barrier timed out; another process is gone")

    monkeypatch.setattr(checkpointer.manager, "save", save)
    with pytest.raises(OSError, match="saving checkpoint 40 in .* DEADLINE_EXCEEDED"):
        checkpointer.save_state(state.replace(step=np.array(40, np.int32)), {"position": 40})
    monkeypatch.undo()
    checkpointer.close()
    assert list_steps(str(tmp_path)) == [20]


def test_unfinished_saves_are_removed_on_resume_and_nothing_else(tmp_path, capsys):
    """A run killed mid-save leaves ``{step}.orbax-checkpoint-tmp-*``: the next run's
    checkpointer removes it (a line each) and keeps every complete checkpoint and other file."""
    state = _state({"w": jnp.arange(3.0)})
    checkpointer = Checkpointer(str(tmp_path), keep=3)
    checkpointer.save_state(state.replace(step=np.array(2, np.int32)), {"position": 2})
    checkpointer.close()
    directory = tmp_path / "checkpoints"
    unfinished = directory / "4.orbax-checkpoint-tmp-1765000000"
    (unfinished / "params").mkdir(parents=True)
    (unfinished / "params" / "half_written").write_bytes(b"\0" * 10)
    kept = [directory / "2.unreadable", directory / "notes.orbax-checkpoint-tmp"]
    for path in kept:
        path.mkdir()
    elsewhere = tmp_path / "snapshots" / "6.orbax-checkpoint-tmp-1"
    elsewhere.mkdir(parents=True)
    capsys.readouterr()

    resumed = Checkpointer(str(tmp_path), keep=3)
    assert not unfinished.exists()
    assert f"removed the unfinished save of step 4: {unfinished}" in capsys.readouterr().out
    assert all(path.is_dir() for path in (*kept, elsewhere))
    restored, data = resumed.restore_state(state)
    assert int(restored.step) == 2 and data == {"position": 2}
    resumed.close()
    assert list_steps(str(tmp_path)) == [2]
