"""The training loop behind ``train.py``: data, state, steps, logs, checkpoints, evaluation.

``train_and_evaluate(config, workdir)`` trains ``config`` in ``workdir``, resuming from
the newest good checkpoint, and ends with loss, perplexity and BLEU on the test split.
Step ``s`` (counted from 1) uses the dropout key ``fold_in(seed_key, s)`` and the batch
after the saved iterator position, so a resumed run repeats an uninterrupted one exactly.
SIGTERM and SIGINT (Ctrl-C) make the loop checkpoint and return after the current step;
SIGUSR1 makes it save the current parameters in ``{workdir}/snapshots/{step}`` and go on
(translate and evaluate load them with ``--checkpoint snapshots/STEP``); see
:mod:`transformer_jax.multihost.signals`.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from transformer_jax import data as data_lib
from transformer_jax.model.config import TransformerConfig
from transformer_jax.multihost.distributed import entered_by_process_zero
from transformer_jax.multihost.signals import Handler, Signals
from transformer_jax.training import checkpoints
from transformer_jax.training.evaluator import Evaluator, describe
from transformer_jax.training.logs import (
    METRICS_FILE,
    MetricsWindow,
    MetricsWriter,
    describe_run_info,
    read_metrics,
    run_info,
    say,
    write_run_info,
)
from transformer_jax.training.prefetch import StepBatches
from transformer_jax.training.run import Run, run_schedule, start_run
from transformer_jax.training.schema import RunConfig
from transformer_jax.training.validation import check_host, validate_config
from transformer_jax.training.workdir import lock_workdir

WINDOW_KEY = "metrics_window"  # in a checkpoint's ``data`` item: the open log window's sums


def train_and_evaluate(
    config: RunConfig, workdir: str, *, sigterm_after: Handler | None = None
) -> dict[str, Any]:
    """Train (or resume) ``config`` in ``workdir``, which no other process may write meanwhile
    (``lock_workdir``). Returns the final evaluation results, or ``{'step': ...,
    'complete': False, 'stopped_by': 'SIGTERM'}`` when a signal stopped it. SIGTERM's handler
    once training has stopped is ``sigterm_after``, by default the one it had before."""
    model_config = validate_config(config)  # before the workdir is created; 'auto' resolved
    check_host(model_config)
    with entered_by_process_zero(lambda: lock_workdir(workdir)):  # refused on every process
        return _train_and_evaluate(config, model_config, workdir, sigterm_after)


def _train_and_evaluate(
    config: RunConfig,
    model_config: TransformerConfig,
    workdir: str,
    sigterm_after: Handler | None,
) -> dict[str, Any]:
    run = start_run(config, model_config, workdir)
    num_steps = config.train.num_steps
    if run.start >= num_steps:
        print(f"the run in {workdir} is complete: step {run.start} of train.num_steps={num_steps}")
        if has_final_results(workdir, run.start):
            run.checkpointer.close()
            return {"step": run.start, "complete": True}
        print("its final evaluation is missing")
    elif run.start:
        print(f"resuming from the checkpoint at step {run.start}")
    data_state = dict(run.data_state or {})
    window = data_state.pop(WINDOW_KEY, None)  # the metrics of the steps since the last log
    train_iter = data_lib.train_iterator(
        config.data, workdir, run.tokenizer, jax.device_count(), data_state or None
    )
    info = run_info(config, run.tokenizer.vocab_size, train_iter, model_config.matmul_precision)
    if jax.process_index() == 0:
        write_run_info(workdir, info)
    say(describe_run_info(info))
    evaluator = Evaluator(config, workdir, run.dp, run.model_config, run.tokenizer)
    trainer = _Trainer(run, train_iter, evaluator, window)
    # Until the run and its final evaluation are saved, a SIGTERM waits for them: every
    # process finishes the same steps and collectives (a second Ctrl-C still stops at once).
    with Signals(sigterm_after) as signals:
        try:
            stopped_by = trainer.train(signals)
        finally:
            run.checkpointer.close()
        if stopped_by:
            trainer.writer.close()
            print(f"{stopped_by}: saved the checkpoint at step {trainer.step}; rerun to resume")
            return {"step": trainer.step, "complete": False, "stopped_by": stopped_by}
        last = max(run.start, num_steps)
        say(f"evaluating step {last} on {config.data.eval_split} ...")
        record = evaluator.dev(trainer.state.params)
        say(describe(last, "dev", record))
        if config.train.final_test:
            say(f"evaluating step {last} on {config.data.test_split} ...")
            record.update(evaluator.test(trainer.state.params, last))
        trainer.writer.write(last, record)
        trainer.writer.close()
        return {"step": last, "complete": True, **record}


def has_final_results(workdir: str, step: int) -> bool:
    """Whether ``metrics.jsonl`` holds the final evaluation of ``step``."""
    if not os.path.isfile(os.path.join(workdir, METRICS_FILE)):
        return False
    return any(r["step"] == step and "eval_loss" in r for r in read_metrics(workdir))


class _Trainer:
    """The steps from the run's start to ``train.num_steps``: updates, logs, checkpoints,
    evaluations and the signals' requests, between steps.

    The metrics of a step are read one step late, so the host never waits for the device
    except at log, checkpoint and evaluation steps; ``train.prefetch`` steps' batches are
    read and placed on the devices ahead by a thread (:mod:`~transformer_jax.training.prefetch`).
    """

    def __init__(
        self,
        run: Run,
        train_iter: data_lib.TrainIterator,
        evaluator: Evaluator,
        window: dict[str, float] | None = None,
    ):
        self.run, self.config, self.dp = run, run.config, run.dp
        self.train_iter, self.evaluator = train_iter, evaluator
        self.schedule = run_schedule(run.config, run.model_config)
        self.writer = MetricsWriter(run.workdir, run.start, enabled=jax.process_index() == 0)
        self.window = MetricsWindow(window)
        self.state = self.dp.replicate(run.state)
        self.step = run.start
        self.pending: tuple[int, dict] | None = None
        self.batches: StepBatches | None = None  # while training
        self.last_loss: float | None = None  # until the first step's metrics are read

    def train(self, signals: Signals) -> str | None:
        """Train to ``train.num_steps``; the name of the signal that stopped it early, if any."""
        train = self.config.train
        bar = tqdm(
            total=train.num_steps,
            initial=self.step,
            desc="train",
            unit="step",
            disable=jax.process_index() != 0,
        )
        put = self.dp.put_batch
        self.batches = StepBatches(self.train_iter, put, train.grad_accum_steps, train.prefetch)
        with bar, self.batches:
            for step in range(self.step + 1, train.num_steps + 1):
                signals.share()  # every process acts on any process's signals at this step
                self.update(step)
                bar.update(1)
                requests = signals.poll()
                self.run.checkpointer.check()  # a failed asynchronous save stops the run now
                last = step == train.num_steps
                log_now = step % train.log_every == 0 or last
                save_now = bool(train.checkpoint_every and step % train.checkpoint_every == 0)
                evaluate_now = bool(train.eval_every and step % train.eval_every == 0)
                if log_now or save_now or evaluate_now or requests.stop or last:
                    self.read_pending()
                else:
                    bar.set_postfix(self.progress())
                if log_now:
                    record = self.window.record(float(self.schedule(step - 1)))
                    record["dropped_too_long"] = self.batches.dropped_too_long
                    self.writer.write(step, record)
                if save_now or requests.stop or last:
                    self.save()
                if requests.snapshot:
                    bar.write(self.snapshot())
                if requests.stop:
                    return requests.stop
                if evaluate_now and not last:
                    record = self.evaluator.dev(self.state.params)
                    self.writer.write(step, record)
                    say(describe(step, "dev", record))
                    self.window.restart_clock()  # tokens/s counts training time only
        return None

    def update(self, step: int) -> None:
        """Apply step ``step`` (the dropout key ``fold_in(state.rng, step)``, taken inside the
        step: ``steps.dropout_key``), reading the previous step's metrics while this one runs."""
        taken = self.batches.next_step()
        self.window.add_wait(self.batches.last_wait)
        for batch in taken.host:
            self.window.add_batch(batch)
        micro = taken.placed
        if len(micro) == 1:
            self.state, metrics = self.dp.train_step(self.state, micro[0])
        else:
            accumulated = self.dp.zero_accumulator(self.state)
            for i, batch in enumerate(micro):
                accumulated = self.dp.accumulate(accumulated, self.state, batch, i)
            self.state, metrics = self.dp.apply(self.state, accumulated)
        self.read_pending()
        self.pending, self.step = (step, metrics), step

    def read_pending(self) -> None:
        """Add the pending step's metrics to the window; stop on a non-finite loss."""
        if self.pending is None:
            return
        step, metrics = self.pending
        self.pending = None
        values = {k: float(v) for k, v in jax.device_get(metrics).items()}
        self.last_loss = values["loss"] / max(values["tokens"], 1.0)
        _check_finite(step, self.last_loss, self.run.checkpointer)
        self.window.add_step(values)

    def progress(self) -> dict[str, str]:
        """The progress bar's postfix: the last loss read, learning rate and tokens/s."""
        loss = {} if self.last_loss is None else {"loss": f"{self.last_loss:.3f}"}
        return {
            **loss,
            "lr": f"{float(self.schedule(self.step - 1)):.2e}",
            "tok_s": f"{self.window.tokens_per_sec():.0f}",
            "wait": f"{self.window.host_wait_fraction():.0%}",
        }

    def save(self) -> None:
        host = self.dp.unreplicate(self.state)
        data = {**self.batches.data_state, WINDOW_KEY: self.window.state()}
        self.run.checkpointer.save_state(host, data)

    def snapshot(self) -> str:
        """Save the current parameters in ``{workdir}/snapshots/{step}``; what was done."""
        snapshots = os.path.join(self.run.workdir, checkpoints.SNAPSHOT_DIR)
        self.run.checkpointer.wait()  # a checkpoint of this step may still be being written
        checkpoints.save_params(snapshots, self.dp.unreplicate(self.state.params), self.step)
        return f"SIGUSR1: saved the parameters of step {self.step} in {snapshots}"


def _check_finite(step: int, loss: float, checkpointer: checkpoints.Checkpointer) -> None:
    if not np.isfinite(loss):
        raise FloatingPointError(
            f"training loss is {loss} at step {step}; stopping. {checkpointer.describe_newest()}"
        )
