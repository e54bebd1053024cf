"""``data_pipeline.py --boundary N``: the training thread's wait for batches across a BPE-dropout
epoch boundary at N pairs (Multi30k repeated), with the next epoch sampled ahead.

The corpus is ``shared/data/multi30k``'s training pairs repeated to N lines (validation
and test: its own). A run with ``data.bpe_dropout`` 0.1 and the base batching
(``data.tokens_per_batch`` 25,000, ``data.max_len`` 256, 8 shards) is prepared (tokenizer,
prepared split, sources); then, in a process of its own, its training iterator feeds
``train.prefetch`` = 2 steps ahead (:class:`StepBatches`, the training loop's) a training thread
that sleeps ``--step-ms`` per step in place of the devices, through the whole first epoch and
``TAIL`` steps past its end. Each step's wait is :attr:`StepBatches.last_wait`, the loop's
``host_wait``. Epoch 1 is sampled meanwhile by ``data.prepare_workers`` (0: one per core)
processes. ``--no-ahead`` times the same boundary with epoch 1 sampled only when it is opened
(by the same workers), as a reference.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from _common import cpu_model, table, write_json

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MULTI30K = next(  # shared/ beside the checkout (or beside its worktrees' folder)
    (
        p
        for p in (f"{_ROOT}/../shared/data/multi30k", f"{_ROOT}/../../shared/data/multi30k")
        if os.path.isdir(p)
    ),
    f"{_ROOT}/../shared/data/multi30k",
)
TAIL = 50  # steps timed after the boundary
STEPS_AROUND = 10  # steps either side of the boundary whose waits make "boundary max"
SPLITS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}


def write_corpus_repeated(directory: str, n: int, source: str | None = None) -> None:
    """Multi30k's training pairs repeated to ``n`` lines in ``{directory}/train.{en,de}``; its
    validation and test sets as they are."""
    os.makedirs(directory, exist_ok=True)
    source = source or MULTI30K
    for lang in ("en", "de"):
        with open(os.path.join(source, f"train.{lang}")) as f:
            lines = f.read().splitlines(keepends=True)
        with open(f"{directory}/train.{lang}", "w") as out:
            for start in range(0, n, len(lines)):
                out.writelines(lines[: min(len(lines), n - start)])
        for split in ("validation", "test"):
            shutil.copy(
                os.path.join(source, f"{SPLITS[split]}.{lang}"), f"{directory}/{split}.{lang}"
            )


def anon_bytes() -> int:
    with open("/proc/self/statm") as f:
        resident, shared = (int(x) * os.sysconf("SC_PAGE_SIZE") for x in f.read().split()[1:3])
    return resident - shared


def run_boundary(config: Any, workdir: str, vocab: int, step_ms: float, ahead: bool) -> dict:
    """The boundary measurement in this process (see the module docstring)."""
    from transformer_jax.data import pipeline, preparation
    from transformer_jax.data.resampled import ResampledEpochs, resampled_dir
    from transformer_jax.training.prefetch import StepBatches

    tokenizer = preparation.get_tokenizer(config, workdir, vocab)
    preparation.prepare_data(config, workdir, tokenizer, [config.train_split])
    path = preparation.prepared_path(config, config.train_split, tokenizer, workdir)
    cache = os.path.join(workdir, preparation.CACHE_DIR)
    shutil.rmtree(resampled_dir(cache, path, config.bpe_dropout, config.seed), True)  # fresh
    if not ahead:
        ResampledEpochs._start_ahead = lambda self, epoch: None  # sampled only when opened
    began, cpu = time.perf_counter(), time.process_time()
    iterator = pipeline.train_iterator(config, workdir, tokenizer, num_shards=8)
    resampler = iterator.resample
    opened = time.perf_counter()
    per_epoch = len(iterator.epoch_plan(0))
    waits, epochs, ready_at = [], [], None
    anon_before = anon_bytes()
    with StepBatches(iterator, lambda batch: batch, 1, depth=2) as batches:
        while True:
            step = batches.next_step()
            waits.append(batches.last_wait)
            epochs.append(step.data_state["epoch"])
            if ready_at is None and os.path.isdir(resampler.path(1)):
                ready_at = time.perf_counter() - opened
            if 1 in epochs and len(epochs) - epochs.index(1) >= TAIL:
                break
            time.sleep(step_ms / 1000)
    resampler.close()
    boundary = epochs.index(1)
    around = waits[max(boundary - STEPS_AROUND, 0) : boundary + STEPS_AROUND]
    window = waits[max(boundary - 50, 0) : boundary + 50]
    return {
        "ahead": ahead,
        "pairs": len(iterator.batcher.pairs),
        "batches_per_epoch": per_epoch,
        "step_ms": step_ms,
        "workers": preparation.workers(config),
        "epoch0_open_s": opened - began,
        "epoch1_ready_s": ready_at,
        "run_s": time.perf_counter() - began,
        "boundary_wait_max_s": max(around),
        "boundary_step_wait_s": waits[boundary],
        "host_wait_100_steps": sum(window) / (sum(window) + len(window) * step_ms / 1000),
        "wait_max_s_after_first_step": max(waits[1:]),
        "anon_added_mib": (anon_bytes() - anon_before) / 2**20,
        "main_cpu_s": time.process_time() - cpu,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "epoch_files": sorted(os.listdir(resampler.directory)),
    }


BOUNDARY_COLUMNS = [
    "pairs",
    "epoch 1 sampled",
    "workers",
    "batches/epoch",
    "step ms",
    "epoch 0 open s",
    "epoch 1 ready s",
    "boundary wait s",
    "max wait ±10 steps s",
    "host_wait ±50 steps",
    "anon added MiB",
]


def measure_boundary(
    args: argparse.Namespace, stage_in_process: Callable[[str, str, Any], dict]
) -> dict[str, Any]:
    """``--boundary N``: each stage by ``stage_in_process``; a table and a record for
    ``--json``."""
    if args.smoke:
        args.vocab = 400
    directory = args.keep or tempfile.mkdtemp(prefix=f"data-boundary-{args.boundary}-")
    try:
        if not os.path.isfile(os.path.join(directory, "test.de")):
            write_corpus_repeated(directory, 2000 if args.smoke else args.boundary)
        stages = ["boundary ahead"] + (["boundary on demand"] if args.no_ahead else [])
        results = [stage_in_process(stage, directory, args) for stage in stages]
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    rows = [
        [
            float(f"{v:.3g}") if isinstance(v, float) else v
            for v in (
                r["pairs"],
                "ahead" if r["ahead"] else "when opened",
                r["workers"],
                r["batches_per_epoch"],
                r["step_ms"],
                r["epoch0_open_s"],
                r["epoch1_ready_s"],
                r["boundary_step_wait_s"],
                r["boundary_wait_max_s"],
                r["host_wait_100_steps"],
                r["anon_added_mib"],
            )
        ]
        for r in results
    ]
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores)")
    print(table(BOUNDARY_COLUMNS, rows))
    payload = {
        "benchmark": "data_pipeline",
        "title": f"BPE-dropout: waits across an epoch boundary, {rows[0][0]:,} pairs",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{cpu_model()} ({os.cpu_count()} cores)",
        "versions": {"jax": None, "torch": None},
        "command": "python benchmarks/data_pipeline.py " + " ".join(sys.argv[1:]),
        "config": "data.bpe_dropout=0.1, data.tokens_per_batch=25000, data.max_len=256, "
        "8 shards, train.prefetch=2, data.prepare_workers=0 (one per core)",
        "current": True,
        "columns": BOUNDARY_COLUMNS,
        "rows": rows,
        "context": [],
        "results": results,
    }
    write_json(args.json, payload)
    return payload
