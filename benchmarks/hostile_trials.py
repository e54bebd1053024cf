"""Hostile trials: the train, translate, evaluate and average commands as the most demanding
user runs them (kills, preemption, damaged checkpoints, read-only and full disks, bad
configs and data, CLI misuse, NaN, concurrent runs, two processes on 127.0.0.1), each trial
on a fresh workdir, its outcome sorted (``_hostile_runs.OUTCOMES``) into a table and a
record in ``benchmarks/results/`` (``benchmarks/tables.py``).

    python benchmarks/hostile_trials.py                     # every trial, 3 kills
    python benchmarks/hostile_trials.py --kills 10 --only kill,sigterm --timeout 300

A tiny run of 8 steps (``_hostile_runs.MICRO``) is the reference: an interrupted and resumed
run must equal it bit for bit (losses and parameters). The target: no traceback, silent
wrong, hang or data loss.
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from typing import Any

import _common
import _hostile_runs as hr
import jax
import numpy as np
from _hostile_multihost import multihost_trials

from transformer_jax.training import checkpoints
from transformer_jax.training.logs import read_metrics

Trial = Callable[[str, str, float], tuple[str, str]]  # (reference, tmp, timeout) -> outcome


def same_run(workdir: str, reference: str) -> str | None:
    """What differs from the reference run (losses, parameters, checkpoints), or None."""

    def losses(w: str) -> dict[int, float]:
        return {r["step"]: r["loss"] for r in read_metrics(w) if "learning_rate" in r}

    if losses(workdir) != losses(reference):
        return "the losses differ from the uninterrupted run"
    _, params, step = checkpoints.load_run(workdir)
    _, expected, _ = checkpoints.load_run(reference)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(expected), strict=True):
        if not np.array_equal(a, b):
            return f"the parameters at step {step} differ from the uninterrupted run"
    return None


def interrupted_then_resumed(sig: signal.Signals, seed: int) -> Trial:
    def trial(reference: str, tmp: str, timeout: float) -> tuple[str, str]:
        workdir = hr.prepared_copy(reference, os.path.join(tmp, "run"))
        proc = hr.start(hr.train_command(workdir), f"{workdir}.log")
        delay = random.Random(seed).uniform(1, 25)
        hr.wait_until(lambda: time.time() - proc.started > delay, [proc], delay + 1)
        proc.send_signal(sig)
        first = hr.wait(proc, timeout)
        expected = (0, 75) if sig == signal.SIGTERM else (0, -9)
        if first.code not in expected:
            return hr.crashed(first) or hr.refused(first)
        again = hr.run(hr.train_command(workdir), f"{workdir}.2.log", timeout)
        if again.code != 0:
            return hr.crashed(again) or ("data loss", f"the rerun: {hr.last_line(again.out)}")
        differs = same_run(workdir, reference)
        detail = f"{sig.name} after {delay:.1f} s (exit {first.code}), resumed: equal"
        return ("silent wrong", differs) if differs else ("OK", detail)

    return trial


def damaged(command: str) -> Trial:
    """One flipped bit in the newest checkpoint (its largest file; of its parameters
    for the commands that read only those), then ``command`` on the run."""

    def trial(reference: str, tmp: str, timeout: float) -> tuple[str, str]:
        workdir = hr.prepared_copy(reference, os.path.join(tmp, "run"), trained=True)
        newest = os.path.join(workdir, "checkpoints", str(hr.STEPS))
        if command != "train":  # the item the parameter-only read path restores
            newest = os.path.join(newest, "params")
        paths = [os.path.join(b, n) for b, _, names in os.walk(newest) for n in names]
        path = max(paths, key=os.path.getsize)
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 0x10
        open(path, "wb").write(bytes(data))
        text = os.path.join(tmp, "src.txt")
        with open(text, "w") as f:
            f.write("the small dog sees the red house .\nthe bird sings .\n")
        args = {
            "train": hr.train_command(workdir),
            "translate": hr.module_command("translate", f"--workdir={workdir}", f"--input={text}"),
            "evaluate": hr.module_command(
                "evaluate", f"--workdir={workdir}", f"--src={text}", f"--ref={text}"
            ),
            "average": hr.module_command("average", f"--workdir={workdir}", "--last=3"),
        }[command]
        ran = hr.run(args, f"{workdir}.log", timeout)
        if crash := hr.crashed(ran):
            return crash
        named = re.search(rf"(step|checkpoint) {hr.STEPS}\b|/{hr.STEPS}\b", ran.out)
        if ran.code == 0 and not named:
            return "silent wrong", f"exit 0 without naming the damaged step {hr.STEPS}"
        if ran.code == 0 and command == "train" and (differs := same_run(workdir, reference)):
            return "silent wrong", differs
        if ran.code == 0:
            return "OK", f"used an older checkpoint, said so: {hr.error_lines(ran.out)[:1]}"
        return hr.refused(ran)

    return trial


def refused_config(*overrides: str, data: bool = False) -> Trial:
    """A train.py command that must be refused in one line before the workdir is touched."""

    def trial(reference: str, tmp: str, timeout: float) -> tuple[str, str]:
        workdir = os.path.join(tmp, "run")
        extra = list(overrides)
        if data:  # text files, one of them a damaged .gz
            text_dir = os.path.join(tmp, "text")
            os.makedirs(text_dir)
            for split in ("train", "validation", "test"):
                for lang in ("en", "de"):
                    with open(os.path.join(text_dir, f"{split}.{lang}"), "w") as f:
                        f.write("a small house .\n" * 50)
            raw = gzip.compress(b"a small house .\n" * 500)
            with open(os.path.join(text_dir, "train.en.gz"), "wb") as f:
                f.write(raw[: len(raw) // 2] + bytes(64))
            os.remove(os.path.join(text_dir, "train.en"))
            extra += ["--config.data.source=text", f"--config.data.text_dir={text_dir}"]
            extra += ["--config.data.src_lang=en", "--config.data.tgt_lang=de"]
        outcome = hr.refused(hr.run(hr.train_command(workdir, *extra), f"{workdir}.log", timeout))
        if outcome[0] == "one-line error" and os.path.isdir(workdir) and not data:
            return outcome[0], outcome[1] + " (the workdir was written first)"
        return outcome

    return trial


def refused_command(*args: str, module: str = "") -> Trial:
    def trial(reference: str, tmp: str, timeout: float) -> tuple[str, str]:
        if module:
            command = hr.module_command(module, *(a.replace("REF", reference) for a in args))
        else:
            command = hr.train_command(os.path.join(tmp, "run"), *args)
        return hr.refused(hr.run(command, os.path.join(tmp, "cli.log"), timeout))

    return trial


def full_disk(reference: str, tmp: str, timeout: float) -> tuple[str, str]:
    """Files over 64 KiB fail (EFBIG): one line with the OS reason; a rerun resumes."""
    workdir = hr.prepared_copy(reference, os.path.join(tmp, "run"))
    ran = hr.run(hr.train_command(workdir), f"{workdir}.log", timeout, file_limit_kib=64)
    outcome = hr.refused(ran)
    if outcome[0] != "one-line error":
        return outcome
    if "too large" not in ran.out.lower():
        return "silent wrong", f"the OS reason is not shown: {outcome[1]}"
    again = hr.run(hr.train_command(workdir), f"{workdir}.2.log", timeout)
    if again.code != 0:
        return "data loss", f"the rerun after the full disk: {hr.last_line(again.out)}"
    return outcome


def read_only(reference: str, tmp: str, timeout: float) -> tuple[str, str]:
    if os.geteuid() == 0:  # root writes through permissions: a path the kernel refuses
        workdir = "/sys/hostile_trials_run"
    else:
        os.chmod(tmp, 0o555)
        workdir = os.path.join(tmp, "run")
    try:
        return hr.refused(hr.run(hr.train_command(workdir), f"{tmp}.log", timeout))
    finally:
        os.chmod(tmp, 0o755)


def nan_loss(reference: str, tmp: str, timeout: float) -> tuple[str, str]:
    workdir = hr.prepared_copy(reference, os.path.join(tmp, "run"))
    big = "--config.train.learning_rate_scale=1e30"
    return hr.refused(hr.run(hr.train_command(workdir, big), f"{workdir}.log", timeout))


def concurrent(reference: str, tmp: str, timeout: float) -> tuple[str, str]:
    """Two train.py on one workdir: one trains to the reference, the other one line."""
    workdir = hr.prepared_copy(reference, os.path.join(tmp, "run"))
    procs = [hr.start(hr.train_command(workdir), f"{workdir}.{i}.log") for i in range(2)]
    ran = sorted((hr.wait(p, timeout) for p in procs), key=lambda r: r.code or 0)
    if ran[0].code != 0:
        return hr.crashed(ran[0]) or hr.refused(ran[0])
    outcome = hr.refused(ran[1], codes=(1,))
    if outcome[0] != "one-line error":
        return outcome
    differs = same_run(workdir, reference)
    return ("silent wrong", differs) if differs else ("OK", f"the other: {outcome[1]}")


def trials(kills: int) -> dict[str, Trial]:
    """Every trial by name (its category is the name's first word)."""
    found: dict[str, Trial] = {}
    for i in range(kills):
        found[f"kill {i}"] = interrupted_then_resumed(signal.SIGKILL, i)
        found[f"sigterm {i}"] = interrupted_then_resumed(signal.SIGTERM, 100 + i)
    for command in ("train", "translate", "evaluate", "average"):
        found[f"damaged checkpoint, {command}"] = damaged(command)
    found["disk read-only"] = read_only
    found["disk full"] = full_disk
    found["config platform=metal"] = refused_config("--config.model.platform=metal")
    found["config platform=gpu on CPU"] = refused_config("--config.model.platform=gpu")
    found["config cudnn+bf16 on CPU"] = refused_config(
        "--config.model.attention_impl=cudnn", "--config.model.dtype=bfloat16"
    )
    found["config vocab_size=2e9"] = refused_config("--config.model.vocab_size=2000000000")
    found["config corrupt .gz"] = refused_config(data=True)
    found["cli unknown flag"] = refused_command("--no_such_flag=1")
    found["cli stray argument"] = refused_command("stray")
    found["cli unknown config"] = refused_command("--config=no_such_config")
    found["cli unknown field"] = refused_command("--config.train.no_such_field=1")
    found["cli unknown command"] = refused_command("frobnicate", module="cli.main")
    found["cli translate without --workdir"] = refused_command(module="translate")
    found["cli evaluate without --src"] = refused_command("--workdir=REF", module="evaluate")
    found["nan huge learning rate"] = nan_loss
    found["concurrent two runs, one workdir"] = concurrent
    found.update(multihost_trials())
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3, help="kill and SIGTERM trials, each")
    parser.add_argument("--only", default="", help="categories, comma-separated (kill,cli,...)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per process")
    parser.add_argument(
        "--out", default="", help="the record (default results/hostile_trials-DATE)"
    )
    args = parser.parse_args(argv)
    chosen = {
        n: t
        for n, t in trials(args.kills).items()
        if not args.only or n.split()[0] in args.only.split(",")
    }
    root = tempfile.mkdtemp(prefix="hostile-")
    reference = os.path.join(root, "reference")
    ran = hr.run(hr.train_command(reference), f"{reference}.log", args.timeout * 2)
    if ran.code != 0:
        raise SystemExit(f"the reference run failed: {hr.last_line(ran.out)}")
    rows: list[list[Any]] = []
    for i, (name, trial) in enumerate(chosen.items()):
        tmp = os.path.join(root, f"trial{i}")
        os.makedirs(tmp)
        started = time.time()
        try:
            outcome, detail = trial(reference, tmp, args.timeout)
        except Exception as e:  # noqa: BLE001 - the harness's own failure, reported as such
            outcome, detail = "traceback", f"harness: {type(e).__name__}: {e}"
        rows.append([name, outcome, round(time.time() - started, 1), detail])
        print(f"{name:<36} {outcome:<15} {rows[-1][2]:>6} s  {detail}", flush=True)
    shutil.rmtree(root, ignore_errors=True)
    report(rows, args)


def report(rows: list[list[Any]], args: argparse.Namespace) -> None:
    totals = {o: sum(r[1] == o for r in rows) for o in hr.OUTCOMES}
    print("\n" + _common.table(["trial", "outcome", "s", "detail"], rows))
    print("\n" + ", ".join(f"{n} {o}" for o, n in totals.items()) + f" ({len(rows)} trials)")
    info = _common.machine()
    date = info["date_utc"][:10]
    record = {
        "benchmark": "hostile_trials",
        "title": f"Hostile trials: {len(rows)} trials, outcomes",
        "date": date,
        "machine": f"{info['cpu']}, {info['nproc']} cores",
        "versions": {"jax": info["jax"], "flax": info["flax"]},
        "command": "python benchmarks/hostile_trials.py "
        + " ".join(f"--{k}={v}" for k, v in vars(args).items() if v and k != "out"),
        "config": "tiny at d_model 32, 8 steps (_hostile_runs.MICRO)",
        "current": False,
        "columns": ["trial", "outcome", "seconds", "detail"],
        "rows": rows,
        "context": ["Totals: " + ", ".join(f"{n} {o}" for o, n in totals.items())],
    }
    out = args.out or os.path.join(
        _common.ROOT, "benchmarks", "results", f"hostile_trials-{date}.json"
    )
    _common.write_json(out, record)


if __name__ == "__main__":
    main()
