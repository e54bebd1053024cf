"""Run logs: ``{workdir}/metrics.jsonl`` (one JSON object per log step), TensorBoard, and
``{workdir}/run_info.json`` (what the run trains on and with, for tools that report on it)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
from tqdm import tqdm

from transformer_jax.data.batching import Batch, TrainIterator, token_counts
from transformer_jax.multihost.distributed import sum_over_processes
from transformer_jax.training.loss import summarize
from transformer_jax.training.schema import RunConfig

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
RUN_INFO_FILE = "run_info.json"


def say(text: str) -> None:
    """Print ``text`` (above the progress bar) on process 0 only: a run's summary,
    evaluations and samples appear once, not once per process."""
    if jax.process_index() == 0:
        tqdm.write(text)


class MetricsWriter:
    """Appends metric records to ``metrics.jsonl`` and TensorBoard scalars.

    A resumed run first drops the records after its restored step (the file is replaced
    whole, never cut in place), and TensorBoard's events are written anew from the records
    kept, so both read as one uninterrupted run. Only process 0 writes.
    """

    def __init__(self, workdir: str, resume_step: int, enabled: bool = True):
        self.enabled = enabled
        self.path = os.path.join(workdir, METRICS_FILE)
        self.writer = None
        if not enabled:
            return
        records = read_metrics(workdir) if os.path.isfile(self.path) else []
        records = [r for r in records if r["step"] <= resume_step]
        with open(f"{self.path}.tmp", "w") as f:
            f.writelines(json.dumps(record) + "\n" for record in records)
        os.replace(f"{self.path}.tmp", self.path)
        from tensorboardX import SummaryWriter

        directory = os.path.join(workdir, TENSORBOARD_DIR)
        stale = os.listdir(directory) if os.path.isdir(directory) else []
        self.writer = SummaryWriter(directory)
        for record in records:
            self._scalars(record["step"], record)
        self.writer.flush()
        for name in stale:
            if name.startswith("events.out.tfevents."):
                os.remove(os.path.join(directory, name))

    def _scalars(self, step: int, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if key != "step" and isinstance(value, int | float):
                self.writer.add_scalar(key, value, step)

    def write(self, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"step": int(step), **values}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        self._scalars(step, values)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class MetricsWindow:
    """Sums of the training metrics since the last log step, and the record they make.

    Tokens/s counts training time only (:meth:`restart_clock` after an evaluation);
    ``grad_norm`` is logged as the mean per step; ``host_wait`` is the fraction of that time
    the training thread waited for its batches.
    """

    KEYS = ("loss", "cross_entropy", "nll", "tokens", "correct", "grad_norm", "steps")

    def __init__(self, saved: dict[str, float] | None = None) -> None:
        """An empty window, or the one :meth:`state` saved with a checkpoint (a resumed
        run's first record covers the same steps as an uninterrupted run's)."""
        self.reset()
        if saved:
            self.sums = {key: float(saved[key]) for key in self.KEYS}
            if jax.process_index() == 0:  # the token counts are every process's, summed
                self.real_tokens, self.slots = int(saved["real_tokens"]), int(saved["slots"])
            self.untimed = self.real_tokens

    def reset(self) -> None:
        self.sums = dict.fromkeys(self.KEYS, 0.0)
        self.real_tokens, self.slots, self.untimed = 0, 0, 0
        self.waited = 0.0
        self.started = time.perf_counter()

    def state(self) -> dict[str, float]:
        """The window's sums, to be saved with a checkpoint (a collective, like :meth:`record`)."""
        real, slots = sum_over_processes([self.real_tokens, self.slots])()
        return {**self.sums, "real_tokens": real, "slots": slots}

    def add_batch(self, batch: Batch) -> None:
        real, slots = token_counts(batch)
        self.real_tokens += real
        self.slots += slots

    def add_step(self, metrics: dict[str, float]) -> None:
        for key in self.KEYS:
            self.sums[key] += metrics.get(key, 1.0 if key == "steps" else 0.0)

    def add_wait(self, seconds: float) -> None:
        self.waited += seconds

    def host_wait_fraction(self) -> float:
        return self.waited / max(time.perf_counter() - self.started, 1e-9)

    def tokens_per_sec(self) -> float:
        return (self.real_tokens - self.untimed) / max(time.perf_counter() - self.started, 1e-9)

    def record(self, learning_rate: float) -> dict[str, float]:
        """The log record of the window (then empty). Its token counts are those of every
        process's batches (a collective: all processes call it at the same step)."""
        real, slots, untimed = sum_over_processes([self.real_tokens, self.slots, self.untimed])()
        record = summarize(self.sums)
        record.update(
            grad_norm=self.sums["grad_norm"] / max(self.sums["steps"], 1.0),
            learning_rate=learning_rate,
            tokens_per_sec=(real - untimed) / max(time.perf_counter() - self.started, 1e-9),
            padding_efficiency=real / max(slots, 1),
            host_wait=self.host_wait_fraction(),
        )
        self.reset()
        return record

    def restart_clock(self) -> None:
        """Start timing again (after an evaluation, which tokens/s does not count)."""
        self.started = time.perf_counter()


def read_metrics(workdir: str) -> list[dict[str, Any]]:
    """The records of ``{workdir}/metrics.jsonl`` (a torn last line is skipped)."""
    records = []
    with open(os.path.join(workdir, METRICS_FILE)) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def run_info(
    config: RunConfig,
    vocab_size: int,
    train_iter: TrainIterator,
    matmul_precision: str,
) -> dict[str, Any]:
    """The facts of a started run: training pairs kept and dropped, batches and tokens per
    epoch (source and target, each with its EOS), vocabulary, devices, processes, parallelism
    and the products' arithmetic (``model.matmul_precision``, an 'auto' resolved here)."""
    stats, batcher = train_iter.stats(), train_iter.batcher
    return {
        "train_pairs": int(stats["pairs"]),
        "dropped_too_long": int(stats["dropped_too_long"]),
        "max_len": int(config.data.max_len),
        "batches_per_epoch": stats["batches_per_epoch"],  # None: packed, planned as read
        "source_tokens_per_epoch": int(batcher.src_lengths[batcher.kept].sum()),
        "target_tokens_per_epoch": int(batcher.tgt_lengths[batcher.kept].sum()),
        "vocab_size": int(vocab_size),
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "parallel": str(config.train.parallel),
        "matmul_precision": matmul_precision,
        **batcher.pairs.read_counts,  # skipped_empty, replaced_lines
    }


def describe_run_info(info: dict[str, Any]) -> str:
    """The line ``train.py`` prints when its training loop starts."""
    per_epoch = info["batches_per_epoch"]
    batches = "packed batches" if per_epoch is None else f"{per_epoch} batches"
    return (
        f"{info['train_pairs']} training pairs ({info['dropped_too_long']} longer than "
        f"data.max_len={info['max_len']} dropped), {batches} per epoch; "
        f"vocabulary {info['vocab_size']}; {info['devices']} device(s), "
        f"train.parallel={info['parallel']}"
    )


def write_run_info(workdir: str, info: dict[str, Any]) -> None:
    """Write ``{workdir}/run_info.json`` whole (a resumed run replaces it with its own start's
    facts; never a torn file). Called by process 0 only."""
    path = os.path.join(workdir, RUN_INFO_FILE)
    with open(f"{path}.tmp", "w") as f:
        json.dump(info, f, indent=2)
    os.replace(f"{path}.tmp", path)


def read_run_info(workdir: str) -> dict[str, Any]:
    """The record of ``{workdir}/run_info.json``; ValueError naming the file if there is none
    (the run never reached its training loop)."""
    path = os.path.join(workdir, RUN_INFO_FILE)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) else e
        raise ValueError(f"cannot read {path}: {reason} (did the run reach its loop?)") from None
