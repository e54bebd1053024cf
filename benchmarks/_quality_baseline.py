"""quality.py's PyTorch baseline (``--vs-torch``): its command's settings, running it,
reading the results it prints, and the side-by-side comparison with the project's run.
"""

from __future__ import annotations

import re
import subprocess
import time
from typing import Any

from _common import ROOT, table

TORCH_ARGS = "--warmup 200 --lr_scale 0.5"  # the baseline's settings for a 30-minute budget
# The files the baseline reads: {split}.{lang} for these splits and languages.
TORCH_DATA = {"train_split": "train", "eval_split": "val", "test_split": "test_2016_flickr"}
TORCH_LANGS = {"src_lang": "en", "tgt_lang": "de"}
_TORCH_DONE = re.compile(
    r"TRAINING DONE: (?P<steps>\d+) steps, (?P<epochs>[\d.]+) epochs, (?P<train_s>\d+)s "
    r"training, (?P<target_tokens>\d+) target tokens, (?P<target_tokens_per_sec>\d+) tgt "
    r"tok/s; final val ls_loss (?P<dev_cross_entropy>\S+) nll (?P<dev_nll>\S+)"
)
_TORCH_BLEU = re.compile(
    r"TEST2016 (?P<mode>greedy|beam\d+): BLEU = (?P<bleu>[\d.]+) .*?\[(?P<signature>[^\]]*)\]"
)
_TORCH_SETUP = re.compile(r"vocab (?P<vocab_size>\d+); train (?P<train_pairs>\d+) pairs")


def parse_torch_output(text: str) -> dict[str, Any]:
    """The results the baseline script prints (its ``TRAINING DONE`` and ``TEST2016`` lines,
    another program's text): steps, epochs, training seconds, target tokens (with EOS) and
    their rate, the final val loss (label-smoothed cross-entropy, PyTorch's convention) and
    NLL per target token, and sacreBLEU by beam size (1 = greedy). ValueError if a line is
    missing."""
    done = _TORCH_DONE.search(text)
    if not done:
        raise ValueError("the baseline's output has no 'TRAINING DONE' line")
    floats = ("epochs", "dev_cross_entropy", "dev_nll")
    result: dict[str, Any] = {
        key: float(value) if key in floats else int(value)
        for key, value in done.groupdict().items()
    }
    setup = _TORCH_SETUP.search(text)
    result.update({k: int(v) for k, v in setup.groupdict().items()} if setup else {})
    result["bleu"] = {}
    for match in _TORCH_BLEU.finditer(text):
        mode = match["mode"]
        result["bleu"][1 if mode == "greedy" else int(mode.removeprefix("beam"))] = float(
            match["bleu"]
        )
        result["signature"] = match["signature"]
    if not result["bleu"]:
        raise ValueError("the baseline's output has no 'TEST2016 ...: BLEU = ' line")
    return result


def run_torch(command: list[str], log_path: str) -> dict[str, Any]:
    """Run the baseline ``command`` to its end; its parsed results and wall-clock seconds."""
    start = time.perf_counter()
    with open(log_path, "w") as log:
        returncode = subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
        ).returncode
    with open(log_path, errors="replace") as f:
        text = f.read()
    if returncode != 0:
        raise RuntimeError(
            f"the baseline failed (exit {returncode}); end of {log_path}:\n{text[-3000:]}"
        )
    try:
        results = parse_torch_output(text)
    except ValueError as e:
        raise ValueError(f"{e} ({log_path})") from None
    return {**results, "wall_s": time.perf_counter() - start}


def compare(project: dict[str, Any], baseline: dict[str, Any]) -> list[dict[str, Any]]:
    """The side-by-side rows: each measure, its meaning, both values and the difference."""
    headline = [r for r in project["test"] if r["model"] in ("single", "ensemble")]
    latest = {r["beam"]: r for r in headline if r["checkpoint"] == "latest"}
    averaged = {r["beam"]: r for r in headline if r["checkpoint"] == "averaged"}
    rows = []
    for scores, checkpoint, label in (
        (latest, "newest checkpoint", ""),
        (
            averaged,
            f"mean of the last {len(project['averaged_steps'])} checkpoints",
            ", averaged",
        ),
    ):
        for beam in sorted(set(scores) & set(baseline["bleu"]), reverse=True):
            name = "greedy" if beam == 1 else f"beam {beam}"
            rows.append(
                (
                    f"test BLEU, {name}{label}",
                    f"sacreBLEU 13a, {checkpoint}",
                    scores[beam]["bleu"],
                    baseline["bleu"][beam],
                )
            )
    first = next(iter(latest.values()))
    rows += [
        ("steps", "updates in the budget", project["step"], baseline["steps"]),
        ("epochs", "passes over the training pairs", project["epochs"], baseline["epochs"]),
        (
            "seconds counted",
            "the budget's clock (see below)",
            project["train_wall_s"],
            float(baseline["train_s"]),
        ),
        (
            "target tokens/s",
            "target tokens with EOS / seconds counted",
            project["target_tokens_per_sec"],
            float(baseline["target_tokens_per_sec"]),
        ),
        ("dev NLL", "per target token of its own BPE", first["dev_nll"], baseline["dev_nll"]),
        (
            "dev cross-entropy",
            "vs the label-smoothed target",
            first["dev_cross_entropy"],
            baseline["dev_cross_entropy"],
        ),
    ]
    return [
        {"measure": m, "meaning": meaning, "project": p, "baseline": b, "difference": p - b}
        for m, meaning, p, b in rows
    ]


def print_comparison(rows: list[dict[str, Any]], test_split: str, script: str, clock: str) -> None:
    print(f"\nthis project vs the PyTorch baseline ({script}), same machine, one after the other:")
    headers = ["measure", "meaning", "this project", "torch baseline", "project - baseline"]
    cells = [
        [r["measure"], r["meaning"], r["project"], r["baseline"], r["difference"]] for r in rows
    ]
    print(table(headers, cells))
    ours = {
        "loop": "from its training loop's start (tokenizer and encoding not counted; "
        "compilation, every step and any in-training evaluation counted)",
        "process": "from train.py's start (tokenizer, encoding, compilation, every step and any "
        "in-training evaluation counted)",
    }[clock]
    print(
        f"test BLEU on {test_split}.\nseconds counted: the baseline's clock runs during its "
        "training steps only (tokenizer, encoding, its periodic validation and decoding not "
        f"counted); the project's {ours}.\ndev losses: the whole dev split, per target token, "
        "each side with its own tokenizer; label smoothing 0.1 spread over all V classes in "
        "PyTorch, over the V-1 others in the project (train.label_smoothing_convention)."
    )
