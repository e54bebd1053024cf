"""Hostile trials: the commands (train, translate, evaluate, average, prepare) as the most
demanding user runs them, in nine groups (``GROUPS``): kills and SIGTERM then resume,
damaged checkpoints and prepared data, read-only and full disks, bad configs and data, CLI
misuse, NaN, concurrent runs, multi-host launch mistakes and the loss of a process. Each
trial runs on a fresh workdir; its outcome is sorted (``_hostile_runs.OUTCOMES``) into a
table, and the counts per group into the record in ``benchmarks/results/``.

    python benchmarks/hostile_trials.py                     # every group, 1 kill each
    python benchmarks/hostile_trials.py --groups resume,nan --kills 3 --timeout 300

A tiny run of 8 steps (``_hostile_runs.MICRO``) is the reference; for the resumed runs, one
of 40 steps (packed batches, and on a mesh): an interrupted and resumed run must equal it
bit for bit (losses and parameters). The target: no traceback, silent wrong, hang or data loss.
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
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
from _hostile_disk import disk_trials
from _hostile_multihost import multihost_trials

from transformer_jax.training import checkpoints
from transformer_jax.training.logs import read_metrics

Trial = Callable[[str, str, float], tuple[str, str]]  # (reference, tmp, timeout) -> outcome
GROUPS = ("resume", "damaged", "disk", "config", "cli", "nan", "concurrency", "multihost", "loss")


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


def interrupted_then_resumed(sig: signal.Signals, seed: int, variant: str) -> Trial:
    """``sig`` once the run has logged a random step (of ``RESUME_STEPS``), then a rerun: it
    must end equal to ``variant``'s uninterrupted run."""

    def trial(micro: str, tmp: str, timeout: float) -> tuple[str, str]:
        reference = hr.reference(micro, variant, timeout * 2)
        extra, variables = hr.VARIANTS[variant]
        workdir = hr.prepared_copy(reference, os.path.join(tmp, "run"))
        command = hr.train_command(workdir, *extra)
        proc = hr.start(command, f"{workdir}.log", env_extra=variables)
        chance = random.Random(seed)
        step, delay = chance.randint(1, hr.RESUME_STEPS - 1), chance.uniform(0, 0.2)
        hr.wait_until(lambda: hr.metrics_step(workdir) >= step, [proc], timeout)
        time.sleep(delay)
        proc.send_signal(sig)
        first = hr.wait(proc, timeout)
        expected = (0, 75) if sig == signal.SIGTERM else (0, -9)
        if first.code not in expected:
            return hr.crashed(first) or hr.refused(first)
        again = hr.run(command, f"{workdir}.2.log", timeout, env_extra=variables)
        if again.code != 0:
            return hr.crashed(again) or ("data loss", f"the rerun: {hr.last_line(again.out)}")
        differs = same_run(workdir, reference)
        ended = "" if first.code else " (it had ended: not interrupted)"
        when = f"{sig.name} after step {step} + {delay:.2f} s (exit {first.code}{ended})"
        return ("silent wrong", differs) if differs else ("OK", f"{when}, resumed: equal")

    return trial


def text_data(tmp: str, damaged_gz: bool) -> list[str]:
    """Overrides reading text files in ``tmp/text``: with ``damaged_gz`` train.en.gz cut in
    half, else no files at all (data missing)."""
    text_dir = os.path.join(tmp, "text")
    os.makedirs(text_dir)
    if damaged_gz:
        for split in ("train", "validation", "test"):
            for lang in ("en", "de"):
                with open(os.path.join(text_dir, f"{split}.{lang}"), "w") as f:
                    f.write("a small house .\n" * 50)
        raw = gzip.compress(b"a small house .\n" * 500)
        with open(os.path.join(text_dir, "train.en.gz"), "wb") as f:
            f.write(raw[: len(raw) // 2] + bytes(64))
        os.remove(os.path.join(text_dir, "train.en"))
    return [
        "--config.data.source=text",
        f"--config.data.text_dir={text_dir}",
        "--config.data.src_lang=en",
        "--config.data.tgt_lang=de",
    ]


def refused_config(*overrides: str, data: str = "") -> Trial:
    """A train.py command refused in one line, leaving no workdir behind; ``data``:
    ``damaged gz`` or ``missing`` text files."""

    def trial(reference: str, tmp: str, timeout: float) -> tuple[str, str]:
        workdir = os.path.join(tmp, "run")
        extra = [*overrides, *(text_data(tmp, data == "damaged gz") if data else [])]
        outcome = hr.refused(hr.run(hr.train_command(workdir, *extra), f"{workdir}.log", timeout))
        if outcome[0] == "one-line error" and os.path.exists(workdir):
            left = sorted(os.listdir(workdir))
            return outcome[0], f"{outcome[1]} (but left the workdir behind: {left})"
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


def nan_loss(checkpoint_every: int, scale: str) -> Trial:
    """The loss turns NaN: one line naming the newest finite checkpoint, which loads."""

    def trial(reference: str, tmp: str, timeout: float) -> tuple[str, str]:
        workdir = hr.prepared_copy(reference, os.path.join(tmp, "run"))
        extra = [f"--config.train.learning_rate_scale={scale}"]
        extra.append(f"--config.train.checkpoint_every={checkpoint_every}")
        ran = hr.run(hr.train_command(workdir, *extra), f"{workdir}.log", timeout)
        outcome = hr.refused(ran)
        if outcome[0] != "one-line error" or "nan" not in outcome[1].lower():
            return outcome
        steps = checkpoints.list_steps(workdir) if os.path.isdir(f"{workdir}/checkpoints") else []
        if steps and f"checkpoint is step {steps[-1]}" not in ran.out:
            return "silent wrong", f"checkpoint {steps[-1]} kept but not named: {outcome[1]}"
        if steps:
            try:
                checkpoints.load_run(workdir)
            except ValueError as e:
                return "data loss", f"checkpoint {steps[-1]} does not load: {e}"[:200]
            return outcome[0], f"{outcome[1]} (it loads)"
        return outcome

    return trial


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


def trials(kills: int) -> dict[str, tuple[str, Trial]]:
    """Every trial by name, with its group (one of ``GROUPS``)."""
    found: dict[str, tuple[str, Trial]] = {}
    for v, variant in enumerate(hr.VARIANTS):
        for i in range(kills):
            seed = 10 * v + i
            found[f"kill {variant} {i}"] = (
                "resume",
                interrupted_then_resumed(signal.SIGKILL, seed, variant),
            )
            found[f"sigterm {variant} {i}"] = (
                "resume",
                interrupted_then_resumed(signal.SIGTERM, 100 + seed, variant),
            )
    found.update(disk_trials(same_run))
    configs = {
        "platform=metal": ["--config.model.platform=metal"],
        "platform=gpu on CPU": ["--config.model.platform=gpu"],
        "cudnn+bf16 on CPU": [
            "--config.model.attention_impl=cudnn",
            "--config.model.dtype=bfloat16",
        ],
        "vocab_size=2e9": ["--config.model.vocab_size=2000000000"],
        "vocab_size=3": ["--config.model.vocab_size=3"],
        "tokens_per_batch < max_len": ["--config.data.tokens_per_batch=8"],
    }
    for name, overrides in configs.items():
        found[f"config {name}"] = ("config", refused_config(*overrides))
    found["data corrupt .gz"] = ("config", refused_config(data="damaged gz"))
    found["data missing text files"] = ("config", refused_config(data="missing"))
    cli = {
        "unknown flag": refused_command("--no_such_flag=1"),
        "stray argument": refused_command("stray"),
        "unknown config": refused_command("--config=no_such_config"),
        "unknown field": refused_command("--config.train.no_such_field=1"),
        "unknown command": refused_command("frobnicate", module="cli.main"),
        "translate without --workdir": refused_command(module="translate"),
        "evaluate without --src": refused_command("--workdir=REF", module="evaluate"),
        "average of no run": refused_command("--workdir=/nonexistent", module="average"),
        "download unknown data set": refused_command("wmt99", "--dest=/tmp/x", module="download"),
    }
    found.update({f"cli {name}": ("cli", trial) for name, trial in cli.items()})
    found["nan from the first step"] = ("nan", nan_loss(2, "1e30"))
    found["nan after a checkpoint"] = ("nan", nan_loss(1, "1e12"))
    found["concurrent two runs, one workdir"] = ("concurrency", concurrent)
    found.update(multihost_trials())
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=1, help="kill and SIGTERM trials, each")
    parser.add_argument("--groups", default="", help=f"comma-separated, of {','.join(GROUPS)}")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per process")
    parser.add_argument(
        "--out", default="", help="the record (default results/hostile_trials-DATE)"
    )
    args = parser.parse_args(argv)
    groups = [g for g in args.groups.split(",") if g] or list(GROUPS)
    if unknown := sorted(set(groups) - set(GROUPS)):
        parser.error(f"unknown groups {unknown}; the groups: {','.join(GROUPS)}")
    chosen = {n: (g, t) for n, (g, t) in trials(args.kills).items() if g in groups}
    root = tempfile.mkdtemp(prefix="hostile-")
    reference = os.path.join(root, "reference")
    started = time.time()
    ran = hr.run(hr.train_command(reference), f"{reference}.log", args.timeout * 2)
    if ran.code != 0:
        raise SystemExit(f"the reference run failed: {hr.last_line(ran.out)}")
    rows: list[list[Any]] = []
    for i, (name, (group, trial)) in enumerate(chosen.items()):
        tmp = os.path.join(root, f"trial{i}")
        os.makedirs(tmp)
        began = time.time()
        try:
            outcome, detail = trial(reference, tmp, args.timeout)
        except Exception as e:  # noqa: BLE001 - the harness's own failure, reported as such
            outcome, detail = "traceback", f"harness: {type(e).__name__}: {e}"
        rows.append([group, name, outcome, round(time.time() - began, 1), detail])
        print(f"{group:<11} {name:<36} {outcome:<15} {rows[-1][3]:>6} s  {detail}", flush=True)
    shutil.rmtree(root, ignore_errors=True)
    report(rows, args, round(time.time() - started))


def counts(rows: list[list[Any]]) -> tuple[list[str], list[list[Any]]]:
    """How many trials of each group (a column; then all) ended in each outcome (a row)."""
    groups = [g for g in GROUPS if any(r[0] == g for r in rows)]
    table = []
    for outcome in hr.OUTCOMES:
        found = [sum(r[0] == g and r[2] == outcome for r in rows) for g in groups]
        table.append([outcome, *found, sum(found)])
    return ["outcome", *groups, "all"], table


def report(rows: list[list[Any]], args: argparse.Namespace, seconds: int) -> None:
    columns, per_group = counts(rows)
    print("\n" + _common.table(columns, per_group))
    print(f"{len(rows)} trials in {seconds} s")
    info = _common.machine()
    date = info["date_utc"][:10]
    command = "python benchmarks/hostile_trials.py " + " ".join(
        f"--{k}={v}" for k, v in vars(args).items() if v and k != "out"
    )
    common = {
        "benchmark": "hostile_trials",
        "date": date,
        "machine": f"{info['cpu']}, {info['nproc']} cores",
        "versions": {"jax": info["jax"], "flax": info["flax"]},
        "command": command,
        "config": "tiny at d_model 32, 8 steps (_hostile_runs.MICRO), resumed runs 40",
        "current": False,
    }
    out = args.out or os.path.join(
        _common.ROOT, "benchmarks", "results", f"hostile_trials-{date}.json"
    )
    detail = {
        **common,
        "title": f"Hostile trials: {len(rows)} trials, each outcome",
        "columns": ["group", "trial", "outcome", "seconds", "detail"],
        "rows": rows,
        "context": [f"{len(rows)} trials in {seconds} s."],
    }
    _common.write_json(out.replace(".json", "-trials.json"), detail)
    summary = {
        **common,
        "title": f"Hostile trials: outcomes per group ({len(rows)} trials)",
        "columns": columns,
        "rows": per_group,
        "context": [f"Each trial: {os.path.basename(out).replace('.json', '-trials.json')}."],
    }
    _common.write_json(out, summary)


if __name__ == "__main__":
    main()
