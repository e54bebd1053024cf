"""Preparing N synthetic pairs with each number of worker processes: seconds, CPU seconds of
the main process and of the workers, peak memory and disk, and whether the files are the same.

The corpus is ``data_pipeline.write_corpus``'s (N lines of ``train.en`` / ``train.de``,
copied as ``validation``). Each stage runs in its own process:

* ``spool``: the training split read from its text files into its spool (one process);
* ``tokenizer``: ``get_tokenizer`` on the spool (the sample drawn by index, BPE training);
* ``encode spool W``: ``prepare_split`` of the training split from its spool with
  ``data.prepare_workers`` = W (the spool restored by hard links before each);
* ``encode text W``: the same for ``validation`` (no spool: the main process reads the text
  and sends the pairs to the workers, as for a split whose tokenizer existed already);
* ``open``: ``open_split`` of the prepared training split in a new process (each file's
  CRC-32 checked once), in seconds and MB/s.

"worker CPU seconds" sums the CPU time of the stage's other processes (the workers, read
from /proc while they run); "peak RSS" is the stage's processes together, "peak disk" the
most the data folder held (spool, partial and prepared files). "same bytes" compares each
encode's files (sha256) with the first one's of the same split. The extrapolation printed at
the end scales the measured per-pair costs to ``--extrapolate`` pairs on ``--cores`` cores.

    python benchmarks/preparation.py --pairs 3000000 --workers 1,2 --json prepare.json
    python benchmarks/preparation.py --smoke
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
from _common import ROOT, cpu_model, table, write_json
from data_pipeline import data_config, write_corpus

TICK = os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, their children, ...), from /proc."""
    found, stack = [], [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    children = [int(child) for child in f.read().split()]
            except OSError:
                continue
            found += children
            stack += children
    return found


def cpu_and_rss(pid: int) -> tuple[float, int]:
    """CPU seconds (user + system) and resident bytes of the process ``pid`` (0 if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK, int(fields[21]) * os.sysconf(
            "SC_PAGE_SIZE"
        )
    except (OSError, IndexError, ValueError):
        return 0.0, 0


def disk_bytes(directory: str) -> int:
    """The bytes the files under ``directory`` occupy (allocated blocks)."""
    total = 0
    for base, _, names in os.walk(directory):
        for name in names:
            try:
                total += os.lstat(os.path.join(base, name)).st_blocks * 512
            except OSError:
                pass
    return total


class Sampler(threading.Thread):
    """Samples this process's descendants (their CPU seconds, the last seen of each) and the
    peaks of the whole tree's RSS and of ``directory``'s disk use, every ``interval`` s."""

    def __init__(self, directory: str, interval: float = 0.5):
        super().__init__(daemon=True)
        self.directory, self.interval, self.stop = directory, interval, threading.Event()
        self.cpu: dict[int, float] = {}
        self.peak_rss = self.peak_disk = 0
        self.own_cpu = 0.0  # this thread's CPU seconds, not the stage's

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            self.sample()
            self.own_cpu = time.thread_time()

    def sample(self) -> None:
        rss = cpu_and_rss(os.getpid())[1]
        for pid in descendants(os.getpid()):
            cpu, resident = cpu_and_rss(pid)
            self.cpu[pid] = max(self.cpu.get(pid, 0.0), cpu)
            rss += resident
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_disk = max(self.peak_disk, disk_bytes(self.directory))


def split_digest(path: str) -> str:
    h = hashlib.sha256()
    for name in ("src.npy", "src_offsets.npy", "tgt.npy", "tgt_offsets.npy"):
        with open(os.path.join(path, name), "rb") as f:
            while block := f.read(1 << 24):
                h.update(block)
    return h.hexdigest()


def run_stage(stage: str, directory: str, vocab: int, workers: int, smoke: bool) -> dict:
    """One stage in this process (the script runs each in a process of its own)."""
    from transformer_jax.data import preparation, prepared
    from transformer_jax.data.sources import ReadCounts, stream_pairs
    from transformer_jax.data.spool import write_spool

    config = dataclasses.replace(data_config(directory, smoke), prepare_workers=workers)
    workdir = os.path.join(directory, "run")
    cache = os.path.join(workdir, "data_cache")
    os.makedirs(cache, exist_ok=True)
    sampler = Sampler(cache)
    sampler.start()
    start, cpu = time.perf_counter(), time.process_time()
    record: dict[str, Any] = {}
    if stage == "spool":
        counts = ReadCounts()
        spool = preparation.spool_path(config, "train", workdir)
        write_spool(stream_pairs(config, "train", counts), spool, counts)
    elif stage == "tokenizer":
        preparation.get_tokenizer(config, workdir, vocab)
    elif stage.startswith("encode"):
        tokenizer = preparation.get_tokenizer(config, workdir, vocab)
        split = "train" if "spool" in stage else "validation"
        path = preparation.prepare_split(config, split, tokenizer, workdir)
        record.update(digest=split_digest(path), prepared_bytes=disk_bytes(path))
    else:  # open
        tokenizer = preparation.get_tokenizer(config, workdir, vocab)
        path = preparation.prepared_path(config, "train", tokenizer, workdir)
        start, cpu = time.perf_counter(), time.process_time()
        prepared.open_split(path)
        record["mb_per_s"] = disk_bytes(path) / 1e6 / (time.perf_counter() - start)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    sampler.stop.set()
    sampler.join()
    record.update(seconds=seconds, cpu_seconds=cpu - sampler.own_cpu)
    record.update(worker_cpu_seconds=sum(sampler.cpu.values()), peak_disk=sampler.peak_disk)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    record["peak_rss"] = max(sampler.peak_rss, own)
    return record


def stage_in_process(stage: str, directory: str, args: argparse.Namespace, workers: int) -> dict:
    command = [sys.executable, __file__, "--stage", stage, "--dir", directory]
    command += ["--vocab", str(args.vocab), "--stage-workers", str(workers)]
    command += ["--smoke"] if args.smoke else []
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise RuntimeError(f"stage {stage!r} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.split("STAGE ", 1)[1])


def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every stage on N pairs; the spool kept by hard links and restored before each encode."""
    directory = args.keep or tempfile.mkdtemp(prefix=f"preparation-{n}-")
    try:
        if not os.path.isfile(os.path.join(directory, "validation.de")):
            write_corpus(directory, n)
        cache = os.path.join(directory, "run", "data_cache")
        shutil.rmtree(os.path.join(directory, "run"), ignore_errors=True)
        stages = {"spool": stage_in_process("spool", directory, args, 1)}
        stages["tokenizer"] = stage_in_process("tokenizer", directory, args, 1)
        (spool,) = [name for name in os.listdir(cache) if name.endswith(".spool")]
        kept = os.path.join(directory, "spool-kept")
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(os.path.join(cache, spool), kept, copy_function=os.link)
        for source in ("spool", "text"):
            for workers in args.workers:
                for name in os.listdir(cache):  # the split prepared anew, from a whole spool
                    shutil.rmtree(os.path.join(cache, name))
                shutil.copytree(kept, os.path.join(cache, spool), copy_function=os.link)
                stage = f"encode {source} {workers}"
                stages[stage] = stage_in_process(stage, directory, args, workers)
                if source == "spool" and workers == args.workers[-1]:
                    stages["open"] = stage_in_process("open", directory, args, workers)
        return {"pairs": n, "stages": stages}
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


def rows_of(result: dict[str, Any]) -> list[list[Any]]:
    gib, stages, rows = 1 << 30, result["stages"], []
    first: dict[str, str] = {}
    for stage, record in stages.items():
        kind, _, workers = stage.rpartition(" ")
        same = None
        if "digest" in record:
            same = "yes" if first.setdefault(kind, record["digest"]) == record["digest"] else "NO"
        rows.append(
            [
                f"{result['pairs']:,}",
                kind if workers.isdigit() else stage,
                int(workers) if workers.isdigit() else None,
                round(record["seconds"], 2),
                round(record["cpu_seconds"], 1),
                round(record["worker_cpu_seconds"], 1),
                round(record["peak_rss"] / gib, 2),
                round(record["peak_disk"] / gib, 3),
                same,
            ]
        )
    return rows


def extrapolate(result: dict[str, Any], pairs: int, cores: int) -> dict[str, float]:
    """Seconds at ``pairs`` on ``cores`` from the per-pair CPU costs measured: the spool and
    the main process's share of encoding are serial, the workers' share divides by the
    cores; BPE training on the capped sample does not grow; checking reads the files."""
    stages, scale = result["stages"], pairs / result["pairs"]
    workers = max(int(s.rpartition(" ")[2]) for s in stages if s.startswith("encode spool"))
    parallel, serial = stages[f"encode spool {workers}"], stages["encode spool 1"]
    main, pool = parallel["cpu_seconds"] * scale, parallel["worker_cpu_seconds"] * scale
    estimate = {
        "spool": stages["spool"]["cpu_seconds"] * scale,
        "tokenizer": stages["tokenizer"]["cpu_seconds"],
        "encode": max(main, pool / cores),
        "encode_one_worker": (serial["cpu_seconds"] + serial["worker_cpu_seconds"]) * scale,
        "open": serial["prepared_bytes"] * scale / 1e6 / stages["open"]["mb_per_s"],
    }
    estimate["total"] = estimate["spool"] + estimate["tokenizer"] + estimate["encode"]
    estimate["total_one_worker"] = sum(estimate[k] for k in ("spool", "tokenizer"))
    estimate["total_one_worker"] += estimate["encode_one_worker"]
    return estimate


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3_000_000, help="pairs of the corpus")
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    parser.add_argument("--vocab", type=int, default=37000, help="model.vocab_size")
    parser.add_argument("--extrapolate", type=int, default=36_000_000, help="pairs")
    parser.add_argument("--cores", type=int, default=32, help="cores of the extrapolation")
    parser.add_argument("--smoke", action="store_true", help="2,000 pairs, vocabulary 400")
    parser.add_argument("--keep", help="the corpus in this directory, kept")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--stage", help=argparse.SUPPRESS)
    parser.add_argument("--stage-workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stage:
        record = run_stage(args.stage, args.dir, args.vocab, args.stage_workers, args.smoke)
        print("STAGE " + json.dumps(record))
        return record
    args.workers = sorted({int(w) for w in args.workers.split(",")} | {1})
    if args.smoke:
        args.pairs, args.vocab = 2000, 400
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores), load {os.getloadavg()[0]:.1f}")
    result = measure(args.pairs, args)
    headers = ["pairs", "stage", "workers", "seconds", "CPU seconds", "worker CPU seconds"]
    headers += ["peak RSS GiB", "peak disk GiB", "same bytes"]
    print(table(headers, rows_of(result)))
    estimate = extrapolate(result, args.extrapolate, args.cores)
    print(
        f"{args.extrapolate:,} pairs on {args.cores} cores: spool {estimate['spool']:.0f} s + "
        f"tokenizer {estimate['tokenizer']:.0f} s + encode {estimate['encode']:.0f} s = "
        f"{estimate['total']:.0f} s (one worker: {estimate['total_one_worker']:.0f} s); "
        f"checking the prepared files at first open: {estimate['open']:.1f} s"
    )
    payload = {"cpu": cpu_model(), "result": result, "extrapolation": estimate}
    payload.update(extrapolate_pairs=args.extrapolate, cores=args.cores)
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
