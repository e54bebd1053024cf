"""The data pipeline at corpus scale: preparing N synthetic pairs, starting a prepared run,
and how many batches the host builds per second against what 8 GPUs consume.

For each N of ``--sizes`` the script writes N pairs in the text layout
(``train.en`` / ``train.de``): each line is two pairs of the embedded synthetic task joined,
one word of each side replaced by a seeded random word of the task, so lines repeat rarely.
Each stage then runs in its own process, timed and with its peak RSS (``ru_maxrss``):

* ``tokenizer``: ``get_tokenizer`` (the split spooled, a sample of
  ``data.tokenizer_train_sentences`` sentences drawn by index, BPE training, vocabulary
  ``--vocab``);
* ``encode``: ``prepare_split`` of the training split (chunks encoded by one process per
  core, written in place into the memory-mapped arrays);
* ``start bucketed`` / ``start packed``: a prepared run's start, ``train_iterator`` (mapping
  the files, the epoch's order and bucketed plan) and its first batch, in seconds and CPU
  seconds (the process's, all threads); "RSS added" is the process's
  resident memory after it minus before it (imports done), "anon added" the part not
  pages of the mapped files (those are shared by a host's processes and evictable);
* with ``--mapped N``, instead of all the above: ``mapped bucketed`` / ``mapped packed``,
  the same start on N pairs of prepared arrays written directly (uint16 ids, source and
  target lengths 1 + Poisson(15.7) and 1 + Poisson(15.3), the synthetic corpus's means; no
  text, tokenizer or encoding), opened with ``prepared.open_split``;
* then ``--batches`` batches: host batches/s (and per CPU second of the process, what one
  core gives whatever else the machine runs) and real target tokens/s, with the base
  config's batching (``data.tokens_per_batch`` 25,000, ``data.max_len`` 256, 8 shards),
  one process filling every row (a process of a multi-host run fills only its share).

With ``--boundary N``, instead: the training thread's wait for batches across a
BPE-dropout epoch boundary at N pairs of Multi30k repeated (``_data_boundary``).

What 8 GPUs consume (the assumption, printed with the table): 8 H100s at ``--mfu`` of
989 dense bfloat16 TFLOP/s each, running the base model at its training FLOPs per token
(``analysis.costs.training_flops_per_token`` at the corpus's mean source and target
lengths) over the batch's 2 x 25,000 token slots: steps/s = 8 x 989e12 x mfu / (FLOPs per
token x 50,000). "headroom" is host batches/s over that.

    python benchmarks/data_pipeline.py --sizes 30000,300000 --json data.json
    python benchmarks/data_pipeline.py --smoke
    python benchmarks/data_pipeline.py --sizes 3000000 --keep /tmp/c3m  # again: start only
    python benchmarks/data_pipeline.py --mapped 36000000 --keep /tmp/m36m --batches 50
    python benchmarks/data_pipeline.py --boundary 3000000 --keep /tmp/b3m --json b.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
from _common import ROOT, cpu_model, table, write_json
from _data_boundary import measure_boundary, run_boundary

H100_BF16_FLOPS = 989e12  # dense bfloat16, SXM datasheet
GPUS = 8


def write_corpus(directory: str, n: int, seed: int = 0) -> dict[str, float]:
    """N perturbed pairs of the synthetic task in ``{directory}/train.{en,de}``."""
    from transformer_jax.data.synthetic import synthetic_pairs

    base = synthetic_pairs("train")
    words = sorted({w for pair in base[:2000] for side in pair for w in side.split()})
    rng = random.Random(seed)
    start = time.perf_counter()
    with open(f"{directory}/train.en", "w") as en, open(f"{directory}/train.de", "w") as de:
        for i in range(n):
            a, b = base[i % len(base)], base[(i * 7919 + i // len(base)) % len(base)]
            for out, side in ((en, 0), (de, 1)):
                tokens = f"{a[side]} {b[side]}".split()
                tokens[rng.randrange(len(tokens))] = rng.choice(words)
                out.write(" ".join(tokens) + "\n")
    for split in ("validation", "test"):
        for lang in ("en", "de"):
            shutil.copy(f"{directory}/train.{lang}", f"{directory}/{split}.{lang}")
    return {"seconds": time.perf_counter() - start}


STAGES = ("tokenizer", "encode", "start bucketed", "start packed")
STAGES_MAPPED = ("mapped bucketed", "mapped packed")
MAPPED_CHUNK = 1 << 20  # pairs written at a time by write_mapped


def write_mapped(path: str, n: int, vocab: int, seed: int = 0) -> None:
    """N pairs of prepared arrays at ``path`` (``prepared.write_split``), a chunk at a time:
    random ids, lengths 1 + Poisson of the synthetic corpus's means."""
    import numpy as np

    from transformer_jax.data import prepared
    from transformer_jax.data.batching import EncodedPairs
    from transformer_jax.data.sources import ReadCounts

    rng = np.random.default_rng(seed)

    def side(size: int, mean: float) -> tuple[np.ndarray, np.ndarray]:
        offsets = np.concatenate([[0], np.cumsum(1 + rng.poisson(mean, size))])
        return rng.integers(4, vocab, offsets[-1], dtype=np.uint16), offsets

    def chunks(done: int):
        for a in range(done * MAPPED_CHUNK, n, MAPPED_CHUNK):
            size = min(MAPPED_CHUNK, n - a)
            yield EncodedPairs(*side(size, 15.7), *side(size, 15.3))

    prepared.write_split(path, chunks, ReadCounts(), vocab, chunk_pairs=MAPPED_CHUNK)


def data_config(directory: str, smoke: bool) -> Any:
    from transformer_jax.data.config import DataConfig

    smaller = {"tokens_per_batch": 2048, "max_len": 64} if smoke else {}
    return DataConfig(source="text", text_dir=directory, **smaller)


def rss_bytes() -> tuple[int, int]:
    """Resident bytes of this process: all, and anonymous (not pages of mapped files)."""
    with open("/proc/self/statm") as f:
        resident, shared = (int(x) * os.sysconf("SC_PAGE_SIZE") for x in f.read().split()[1:3])
    return resident, resident - shared


def start_run(stage: str, directory: str, config: Any, tokenizer: Any) -> Any:
    """A prepared run's training iterator: of the text corpus's preparation (``start ...``)
    or of the arrays ``write_mapped`` wrote (``mapped ...``)."""
    from transformer_jax.data import pipeline, prepared
    from transformer_jax.data.batching import TrainIterator

    config = dataclasses.replace(config, packing=stage.endswith("packed"))
    workdir = os.path.join(directory, "run")
    if stage.startswith("start"):
        return pipeline.train_iterator(config, workdir, tokenizer, num_shards=GPUS)
    encoded, _ = prepared.open_split(os.path.join(directory, "mapped"))
    return TrainIterator(pipeline.make_batcher(config, encoded, GPUS), config.seed)


def run_stage(
    stage: str, directory: str, vocab: int, batches: int, smoke: bool, step_ms: float = 0.0
) -> dict:
    """One stage in this process (the script runs each in a process of its own)."""
    import numpy as np

    from transformer_jax.data import preparation

    config = data_config(directory, smoke)
    workdir = os.path.join(directory, "run")
    before, start = rss_bytes(), time.perf_counter()
    record: dict[str, Any] = {}
    if stage.startswith("boundary"):
        tokens = 25_000 if not smoke else 2048
        config = dataclasses.replace(config, bpe_dropout=0.1, tokens_per_batch=tokens)
        return run_boundary(config, workdir, vocab, step_ms, ahead=stage == "boundary ahead")
    if stage == "tokenizer":
        preparation.get_tokenizer(config, workdir, vocab)
    else:
        mapped = stage.startswith("mapped")
        tokenizer = None if mapped else preparation.get_tokenizer(config, workdir, vocab)
        before, start, cpu = rss_bytes(), time.perf_counter(), time.process_time()
        if stage == "encode":
            preparation.prepare_split(config, "train", tokenizer, workdir)
        else:
            iterator = start_run(stage, directory, config, tokenizer)
            next(iterator)
            record["seconds"] = time.perf_counter() - start
            record["cpu_seconds"] = time.process_time() - cpu  # this process, all threads
            (resident, anon), (resident_before, anon_before) = rss_bytes(), before
            record["rss_added"], record["anon_added"] = (
                resident - resident_before,
                anon - anon_before,
            )
            pairs = iterator.batcher.pairs
            record["mean_src_len"] = float(pairs.src_offsets[-1] / len(pairs))
            record["mean_tgt_len"] = float(pairs.tgt_offsets[-1] / len(pairs))
            began, cpu, tokens = time.perf_counter(), time.process_time(), 0
            for _ in range(batches):
                tokens += int(np.count_nonzero(next(iterator)["tgt_out"]))
            elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
            record.update(batches_per_s=batches / elapsed, tgt_tokens_per_s=tokens / elapsed)
            record["batches_per_cpu_s"] = batches / cpu
    record.setdefault("seconds", time.perf_counter() - start)
    record["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return record


def stage_in_process(stage: str, directory: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--stage", stage, "--dir", directory]
    command += ["--vocab", str(args.vocab), "--batches", str(args.batches)]
    command += ["--step-ms", str(args.step_ms)]
    command += ["--smoke"] if args.smoke else []
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise RuntimeError(f"stage {stage!r} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.split("STAGE ", 1)[1])


def gpu_steps_per_s(mean_src: float, mean_tgt: float, mfu: float) -> float:
    """Steps/s of 8 H100s on base (see the module docstring)."""
    from transformer_jax.analysis.costs import training_flops_per_token
    from transformer_jax.model.config import TransformerConfig

    per_token = training_flops_per_token(
        TransformerConfig(vocab_size=37000), round(mean_src) + 1, round(mean_tgt) + 1
    )
    return GPUS * H100_BF16_FLOPS * mfu / (per_token * 2 * 25_000)


def _done(stage: str, directory: str) -> bool:
    """Whether ``stage``'s output is already in ``directory`` (``--keep``)."""
    if stage == "tokenizer":
        return os.path.isfile(os.path.join(directory, "run", "tokenizer.model"))
    cache = os.path.join(directory, "run", "data_cache")
    return (
        stage == "encode"
        and os.path.isdir(cache)
        and any(os.path.isfile(os.path.join(cache, f, "info.json")) for f in os.listdir(cache))
    )


def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    directory = args.keep or tempfile.mkdtemp(prefix=f"data-pipeline-{n}-")
    try:
        result: dict[str, Any] = {"pairs": n}
        if args.mapped:
            return measure_mapped(n, directory, args, result)
        if not os.path.isfile(os.path.join(directory, "test.de")):
            result["write_corpus"] = write_corpus(directory, n)
        for stage in STAGES:
            if not (args.keep and _done(stage, directory)):
                result[stage] = stage_in_process(stage, directory, args)
        cache = os.path.join(directory, "run", "data_cache")
        (prepared,) = [os.path.join(cache, f) for f in os.listdir(cache) if "." not in f]
        result["prepared_bytes"] = sum(
            os.path.getsize(os.path.join(prepared, f)) for f in os.listdir(prepared)
        )
        start = result["start bucketed"]
        result["gpu_steps_per_s"] = gpu_steps_per_s(
            start["mean_src_len"], start["mean_tgt_len"], args.mfu
        )
        return result
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


def measure_mapped(
    n: int, directory: str, args: argparse.Namespace, result: dict[str, Any]
) -> dict[str, Any]:
    """The ``mapped ...`` starts of N pairs of written arrays (kept in ``--keep``'s directory)."""
    path = os.path.join(directory, "mapped")
    if not os.path.isdir(path):
        write_mapped(path, n, args.vocab)
    for stage in STAGES_MAPPED:
        result[stage] = stage_in_process(stage, directory, args)
    result["prepared_bytes"] = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    start = result["mapped bucketed"]
    result["gpu_steps_per_s"] = gpu_steps_per_s(
        start["mean_src_len"], start["mean_tgt_len"], args.mfu
    )
    return result


def rows_of(result: dict[str, Any]) -> list[list[Any]]:
    gib = 1 << 30
    rows = []
    for stage in STAGES + STAGES_MAPPED:
        if stage not in result:  # already done in --keep's directory
            continue
        record = result[stage]
        rate = record.get("batches_per_s", float("nan"))
        rows.append(
            [
                f"{result['pairs']:,}",
                stage,
                record["seconds"],
                record.get("cpu_seconds", float("nan")),
                record["peak_rss"] / gib,
                record.get("rss_added", float("nan")) / gib,
                record.get("anon_added", float("nan")) / gib,
                rate,
                record.get("batches_per_cpu_s", float("nan")),
                record.get("tgt_tokens_per_s", float("nan")),
                rate / result["gpu_steps_per_s"],
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="30000,300000,3000000", help="pairs, comma-separated")
    parser.add_argument("--vocab", type=int, default=37000, help="model.vocab_size")
    parser.add_argument("--batches", type=int, default=200, help="timed batches per layout")
    parser.add_argument("--mfu", type=float, default=0.4, help="the GPUs' assumed MFU")
    parser.add_argument("--smoke", action="store_true", help="2,000 pairs, small batches")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument(
        "--keep",
        help="one size's corpus and preparation in this directory, kept; the stages whose "
        "output is there already (tokenizer, prepared split) are skipped",
    )
    parser.add_argument(
        "--mapped",
        type=int,
        help="only the starts of this many pairs of prepared arrays written directly",
    )
    parser.add_argument(
        "--boundary",
        type=int,
        help="only the wait for batches across a BPE-dropout epoch boundary at this many pairs",
    )
    parser.add_argument(
        "--step-ms", type=float, default=100.0, help="--boundary: the emulated device step"
    )
    parser.add_argument(
        "--no-ahead", action="store_true", help="--boundary: also epoch 1 sampled when opened"
    )
    parser.add_argument("--stage", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stage:
        record = run_stage(args.stage, args.dir, args.vocab, args.batches, args.smoke, args.step_ms)
        print("STAGE " + json.dumps(record))
        return record
    if args.boundary:
        return measure_boundary(args, stage_in_process)
    sizes = [args.mapped] if args.mapped else [int(s) for s in args.sizes.split(",")]
    if not sizes or min(sizes) < 1 or args.batches < 1 or not 0 < args.mfu <= 1:
        raise ValueError("--sizes and --batches must be positive, --mfu in (0, 1]")
    if args.smoke:
        sizes, args.vocab, args.batches = [2000], 400, 3
    if args.keep and len(sizes) != 1:
        raise ValueError("--keep takes one size")
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores)")
    results = [measure(n, args) for n in sizes]
    headers = [
        "pairs",
        "stage",
        "seconds",
        "CPU seconds",
        "peak RSS GiB",
        "RSS added GiB",
        "anon added GiB",
        "batches/s",
        "batches/CPU s",
        "tgt tokens/s",
        "headroom",
    ]
    print(table(headers, [row for r in results for row in rows_of(r)]))
    steps = results[-1]["gpu_steps_per_s"]
    print(
        f"8 GPUs consume {steps:.1f} steps/s (8 x H100 at {args.mfu:.0%} of 989 bf16 TFLOP/s, "
        "base's training FLOPs per token x 50,000 token slots per step)"
    )
    for r in results:
        print(f"{r['pairs']:,} pairs prepared: {r['prepared_bytes'] / 2**20:.1f} MiB on disk")
    payload = {"cpu": cpu_model(), "mfu": args.mfu, "results": results}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
