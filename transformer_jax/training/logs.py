"""Run logs: ``{workdir}/metrics.jsonl`` (one JSON object per log step) and TensorBoard."""

from __future__ import annotations

import json
import os
from typing import Any

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


class MetricsWriter:
    """Appends metric records to ``metrics.jsonl`` and TensorBoard scalars.

    A resumed run first drops the records after its restored step, so the file reads as
    one uninterrupted run. Only process 0 writes.
    """

    def __init__(self, workdir: str, resume_step: int, enabled: bool = True):
        self.enabled = enabled
        self.path = os.path.join(workdir, METRICS_FILE)
        self.writer = None
        if not enabled:
            return
        records = read_metrics(workdir) if os.path.isfile(self.path) else []
        with open(self.path, "w") as f:
            for record in records:
                if record["step"] <= resume_step:
                    f.write(json.dumps(record) + "\n")
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(os.path.join(workdir, TENSORBOARD_DIR))

    def write(self, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"step": int(step), **values}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        for key, value in values.items():
            if isinstance(value, int | float):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


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
