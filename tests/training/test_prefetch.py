"""Batches read and placed ahead by a thread (``train.prefetch``): the saved iterator state
counts only the batches the steps took, errors reach the training thread with their
message, the thread stops with the loop, and the loop logs the time it waited."""

import threading
import time

import numpy as np
import pytest
from test_loop import micro_config, prepared, workdir_from  # noqa: F401  (a fixture)

from transformer_jax import data as data_lib
from transformer_jax.training.logs import read_metrics
from transformer_jax.training.loop import WINDOW_KEY, train_and_evaluate
from transformer_jax.training.prefetch import StepBatches
from transformer_jax.training.run import start_run
from transformer_jax.training.schema import RunConfig
from transformer_jax.training.validation import validate_config


class Counting:
    """An iterator with TrainIterator's interface whose batch ``i`` is ``{'x': [i]}``; it
    raises ``error`` instead of batch ``fail_at``."""

    def __init__(self, fail_at=None, error=None):
        self.index, self.fail_at, self.error = 0, fail_at, error

    def __next__(self):
        if self.index == self.fail_at:
            raise self.error
        self.index += 1
        return {"x": np.array([self.index - 1])}

    def get_state(self):
        return {"epoch": 0, "index": self.index}

    def stats(self):
        return {"dropped_too_long": 7}


def wait_until(predicate, timeout=10.0):
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def placed(x):
    return {k: v * 10 for k, v in x.items()}


@pytest.mark.parametrize("depth", [0, 2])
def test_the_state_counts_the_batches_taken_not_those_read_ahead(depth):
    source = Counting()
    with StepBatches(source, placed, micro_batches=3, depth=depth) as batches:
        assert batches.data_state == {"epoch": 0, "index": 0}
        first, second = batches.next_step(), batches.next_step()
        if depth:  # the thread has two more steps ready and holds a third
            wait_until(lambda: source.index == 15)
        assert batches.data_state == {"epoch": 0, "index": 6} == second.data_state
        assert [int(b["x"][0]) for b in first.host + second.host] == list(range(6))
        assert [int(b["x"][0]) for b in second.placed] == [30, 40, 50]
        assert batches.dropped_too_long == 7 and batches.last_wait >= 0.0
    assert source.index == (15 if depth else 6)


def test_an_error_of_the_thread_is_raised_on_the_training_thread_after_the_good_steps():
    source = Counting(fail_at=4, error=ValueError("data.text_dir: train.en is not UTF-8"))
    with StepBatches(source, placed, micro_batches=2, depth=2) as batches:
        assert [int(b["x"][0]) for b in batches.next_step().host] == [0, 1]
        assert [int(b["x"][0]) for b in batches.next_step().host] == [2, 3]
        with pytest.raises(ValueError, match=r"^data.text_dir: train.en is not UTF-8$"):
            batches.next_step()
        assert batches.data_state == {"epoch": 0, "index": 4}


def test_the_thread_stops_when_the_loop_ends_or_fails():
    source = Counting()
    with pytest.raises(KeyboardInterrupt):
        with StepBatches(source, placed, micro_batches=1, depth=2) as batches:
            batches.next_step()
            wait_until(lambda: source.index == 4)  # two steps queued, one waiting to be
            raise KeyboardInterrupt
    assert not any(t.name == "prefetch" for t in threading.enumerate())
    assert source.index == 4  # nothing read after the stop


def test_a_negative_prefetch_depth_names_the_field(tmp_path):
    config, _ = micro_config(tmp_path)
    config.train.prefetch = -1
    with pytest.raises(ValueError, match=r"^train.prefetch must be an integer >= 0, got -1$"):
        validate_config(RunConfig.from_config(config))


def test_the_checkpoint_holds_the_state_after_the_consumed_micro_batches(prepared, tmp_path):  # noqa: F811
    config, _ = micro_config(tmp_path, steps=3, every=3)
    config.train.update(grad_accum_steps=2, prefetch=2)
    config = RunConfig.from_config(config)
    workdir = workdir_from(prepared, tmp_path / "run")
    result = train_and_evaluate(config, workdir)
    assert result["complete"] and result["step"] == 3
    records = [r for r in read_metrics(workdir) if "loss" in r]
    assert len(records) == 3 and all(0.0 <= r["host_wait"] < 1.0 for r in records)
    run = start_run(config, validate_config(config), workdir)
    run.checkpointer.close()
    reference = data_lib.train_iterator(config.data, workdir, run.tokenizer, 1, None)
    for _ in range(3 * 2):  # three steps of two micro-batches; the thread read ahead of them
        next(reference)
    run.data_state.pop(WINDOW_KEY)  # the open log window's sums, saved beside it
    assert run.data_state == reference.get_state()
