"""Time to BLEU: train on a ``{split}.{lang}`` text directory for a wall-clock budget, then
score the test split with sacreBLEU (beam search, the project's own decoding).

The run is the project's own command, ``python train.py --config configs/multi30k.py``
(any ``--config.<section>.<field>=value`` given here is passed on), started in a fresh
workdir. The budget counts everything that command does: tokenizer training, encoding
the data, compilation and the steps. When it is spent, the trainer gets SIGTERM, which
makes the training loop finish its step, save a checkpoint and exit. The newest
checkpoint is then translated (``transformer_jax.inference.translation.translate_lines``, beam 4 and
greedy) and scored (``transformer_jax.inference.bleu.bleu``), and its loss, perplexity and
accuracy on every dev pair are measured (dev loss rising while training loss falls is
over-fitting, the thing to tune against); with ``--average N`` so is the mean of the
last N checkpoints (``transformer_jax.average``, paper §6.1). With ``--minutes 30,60``
the run also gets SIGUSR1 at 30 minutes, saves its parameters then and goes on; that
snapshot is scored too: one run reports both budgets. Evaluation is not counted in the
budget. Reported: BLEU, steps, epochs, the training loop's tokens/s and the loss
curve from ``{workdir}/metrics.jsonl``.

    python benchmarks/quality.py --minutes 30 --workdir runs/multi30k-30min
    python benchmarks/quality.py --minutes 30,60 --workdir runs/multi30k-60min --json out.json
    python benchmarks/quality.py --minutes 30 --data-dir DIR --src-lang en --tgt-lang fr
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
from _common import ROOT, describe_machine, machine, table, write_json

DEFAULT_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data", "multi30k")
DEFAULT_CONFIG = os.path.join(ROOT, "configs", "multi30k.py")
SMOKE_OVERRIDES = {  # a model and run small enough for a test
    "model.vocab_size": 300,
    "model.d_model": 16,
    "model.num_heads": 2,
    "model.d_ff": 32,
    "model.num_encoder_layers": 1,
    "model.num_decoder_layers": 1,
    "data.tokens_per_batch": 256,
    "train.num_steps": 2,
    "train.warmup_steps": 2,
    "train.log_every": 1,
    "train.checkpoint_every": 1,
    "train.eval_sentences": 0,
    "decode.beam_size": 1,
    "train.samples": 0,
    "decode.max_extra_len": 4,
}


def train_within_budget(command: list[str], marks: list[float], log_path: str) -> dict[str, Any]:
    """Run ``command``; at each of ``marks`` (minutes, ascending) but the last send SIGUSR1
    (the loop saves a parameter snapshot and goes on), at the last SIGTERM (the loop
    checkpoints and exits). Returns timings."""
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        stopped = False
        for i, minutes in enumerate(marks):
            try:
                proc.wait(timeout=max(minutes * 60 - (time.perf_counter() - start), 0.0))
                break  # finished (or failed) before the mark
            except subprocess.TimeoutExpired:
                last = i == len(marks) - 1
                proc.send_signal(signal.SIGTERM if last else signal.SIGUSR1)
                stopped = last
        budget_s = time.perf_counter() - start
        returncode = proc.wait()
    if returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        hint = " (the budget ended before the training loop started?)" if stopped else ""
        raise RuntimeError(f"training failed (exit {returncode}){hint}; end of {log_path}:\n{tail}")
    return {
        "train_wall_s": budget_s,
        "exit_wall_s": time.perf_counter() - start,
        "stopped_by_budget": stopped,
    }


def parse_log(log_path: str) -> dict[str, int]:
    """Training pairs and batches per epoch, from the loop's first line."""
    with open(log_path, errors="replace") as f:
        text = f.read()
    match = re.search(r"(\d+) training pairs .*?(\d+) batches per epoch", text)
    if not match:
        return {}
    return {"train_pairs": int(match.group(1)), "batches_per_epoch": int(match.group(2))}


def parse_marks(text: str) -> list[float]:
    """``'30,60'`` -> ``[30.0, 60.0]``: positive and ascending, else ValueError."""
    try:
        marks = [float(m) for m in text.split(",")]
    except ValueError:
        raise ValueError(f"--minutes must be numbers separated by commas, got {text!r}") from None
    if any(m <= 0 for m in marks) or marks != sorted(set(marks)):
        raise ValueError(f"--minutes must be positive and ascending, got {text!r}")
    return marks


def dev_metrics(
    config: Any, model_config: Any, params: Any, tokenizer: Any, workdir: str
) -> dict[str, float]:
    """Loss (label-smoothed), perplexity and accuracy of ``params`` on every pair of the
    run's dev split (``config.data.eval_split``), measured as ``train.py`` measures them."""
    from transformer_jax.data.pipeline import eval_split_batches
    from transformer_jax.model.transformer import Transformer
    from transformer_jax.training.evaluator import evaluate_loss
    from transformer_jax.training.parallel import DataParallel

    dp = DataParallel(
        config.train.parallel, Transformer(model_config), config.train.label_smoothing
    )
    batches, _ = eval_split_batches(config.data, workdir, tokenizer, dp.num_devices)
    return evaluate_loss(dp, dp.replicate(params), batches)


def evaluate(
    workdir: str, split: str, beams: list[int], checkpoint: str, minutes: float
) -> list[dict[str, Any]]:
    """sacreBLEU on ``split`` of one checkpoint ('latest', 'averaged' or 'snapshots/STEP',
    the parameters after ``minutes`` of training), per beam size, with its dev metrics."""
    from transformer_jax.data import load_pairs, load_tokenizer
    from transformer_jax.inference.bleu import bleu
    from transformer_jax.inference.translation import translate_lines
    from transformer_jax.model.config import from_config_dict
    from transformer_jax.training.checkpoints import load_run

    config, params, step = load_run(workdir, checkpoint)
    model_config = from_config_dict(config.model)
    tokenizer = load_tokenizer(os.path.join(workdir, "tokenizer.model"))
    dev = dev_metrics(config, model_config, params, tokenizer, workdir)
    pairs = load_pairs(config.data, split)
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    rows = []
    for beam in beams:
        start = time.perf_counter()
        hypotheses = translate_lines(
            model_config,
            params,
            tokenizer,
            sources,
            beam_size=beam,
            alpha=config.decode.alpha,
            max_extra_len=config.decode.max_extra_len,
        )
        result = bleu(hypotheses, references)
        rows.append(
            {
                "minutes": minutes,
                "checkpoint": checkpoint,
                "step": int(step),
                "beam": beam,
                "sentences": len(pairs),
                "bleu": float(result.score),
                "signature": str(getattr(result, "signature", "")),
                "decode_s": time.perf_counter() - start,
                **{f"dev_{name}": value for name, value in dev.items()},
                "example": {
                    "source": sources[0],
                    "reference": references[0],
                    "output": hypotheses[0],
                },
            }
        )
    return rows


def loss_curve(workdir: str, points: int = 12) -> list[dict[str, Any]]:
    """About ``points`` records of ``metrics.jsonl`` (evenly spaced, the last included)."""
    from transformer_jax.training.logs import read_metrics

    records = [r for r in read_metrics(workdir) if "loss" in r and "tokens_per_sec" in r]
    if len(records) <= points:
        return records
    stride = len(records) / points
    chosen = [records[int(i * stride)] for i in range(points)]
    return chosen if chosen[-1] is records[-1] else [*chosen, records[-1]]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Other --config.<section>.<field>=value arguments are passed to train.py.",
    )
    parser.add_argument(
        "--minutes",
        required=True,
        help="training budget; a comma list (30,60) also scores a snapshot at each earlier mark",
    )
    parser.add_argument("--data-dir", default=DEFAULT_DATA, help="{split}.{lang} text files")
    parser.add_argument("--src-lang", default="en")
    parser.add_argument("--tgt-lang", default="de")
    parser.add_argument("--train-split", default="train")
    parser.add_argument("--eval-split", default="val")
    parser.add_argument("--test-split", default="test_2016_flickr")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="train.py config file")
    parser.add_argument("--workdir", required=True, help="a new directory for the run")
    parser.add_argument("--beams", default="4,1", help="beam sizes to score (1 = greedy)")
    parser.add_argument(
        "--average", type=int, default=0, help="also score the mean of the last N checkpoints"
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny model for two steps")
    parser.add_argument("--json", help="write the results to this file")
    args, passthrough = parser.parse_known_args(argv)
    unknown = [a for a in passthrough if not a.startswith("--config.")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    marks = parse_marks(args.minutes)
    if not os.path.isdir(args.data_dir):
        raise ValueError(f"--data-dir {args.data_dir!r} is not a directory")
    if os.path.isdir(args.workdir) and os.listdir(args.workdir):
        raise ValueError(f"--workdir {args.workdir!r} is not empty: time-to-BLEU needs a new run")
    beams = [int(b) for b in args.beams.split(",")]

    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    overrides = {
        "data.source": "text",
        "data.text_dir": os.path.abspath(args.data_dir),
        "data.src_lang": args.src_lang,
        "data.tgt_lang": args.tgt_lang,
        "data.train_split": args.train_split,
        "data.eval_split": args.eval_split,
        "data.test_split": args.test_split,
        **(SMOKE_OVERRIDES if args.smoke else {}),
    }
    command = [sys.executable, os.path.join(ROOT, "train.py"), f"--config={args.config}"]
    command += [f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in overrides.items())]
    command += passthrough
    info = machine()
    print(f"machine: {describe_machine(info)}")
    print(f"training for at most {marks[-1]:g} min:\n  {' '.join(command)}")
    log_path = os.path.join(workdir, "train.log")
    timing = train_within_budget(command, marks, log_path)
    counts = parse_log(log_path)
    from transformer_jax.training.checkpoints import SNAPSHOT_DIR, list_steps

    step = list_steps(workdir)[-1]
    scores = []
    snapshots = list_steps(workdir, SNAPSHOT_DIR) if len(marks) > 1 else []
    for minutes, snapshot in zip(marks, snapshots, strict=False):
        scores += evaluate(workdir, args.test_split, beams, f"{SNAPSHOT_DIR}/{snapshot}", minutes)
    scores += evaluate(workdir, args.test_split, beams, "latest", marks[-1])
    if args.average > 1:
        from transformer_jax.cli.average import average_checkpoints

        averaged, _ = average_checkpoints(workdir, min(args.average, len(list_steps(workdir))))
        print(f"averaged the checkpoints of steps {averaged}")
        scores += evaluate(workdir, args.test_split, beams, "averaged", marks[-1])
    curve = loss_curve(workdir)
    epochs = step / counts["batches_per_epoch"] if counts else float("nan")
    speeds = [r["tokens_per_sec"] for r in curve[1:]] or [float("nan")]

    print(
        f"\ntrained {timing['train_wall_s'] / 60:.1f} min "
        f"({'stopped by the budget' if timing['stopped_by_budget'] else 'finished'}): "
        f"step {step}, {epochs:.2f} epochs; log {log_path}"
    )
    print(
        table(
            [
                "minutes",
                "test split",
                "sentences",
                "checkpoint",
                "step",
                "beam",
                "sacreBLEU",
                "decode s",
                "dev loss",
                "dev ppl",
            ],
            [
                [
                    r["minutes"],
                    args.test_split,
                    r["sentences"],
                    r["checkpoint"],
                    r["step"],
                    r["beam"],
                    r["bleu"],
                    r["decode_s"],
                    r["dev_loss"],
                    r["dev_perplexity"],
                ]
                for r in scores
            ],
        )
    )
    print(f"signature: {scores[0]['signature']}")
    print(f"example: {scores[0]['example']}")
    if not curve:
        print("\nno training log records (fewer steps than train.log_every)")
    print("\nloss curve (metrics.jsonl; tokens/s = real source + target tokens per second):")
    print(
        table(
            ["step", "loss", "accuracy", "learning rate", "tokens/s", "padding efficiency"],
            [
                [
                    r["step"],
                    r["loss"],
                    r.get("accuracy", float("nan")),
                    f"{r.get('learning_rate', float('nan')):.2e}",
                    r["tokens_per_sec"],
                    r.get("padding_efficiency", float("nan")),
                ]
                for r in curve
            ],
        )
    )
    payload = {
        "machine": info,
        "command": command,
        "minutes": marks,
        **timing,
        **counts,
        "step": step,
        "epochs": epochs,
        "median_tokens_per_sec": sorted(speeds)[len(speeds) // 2],
        "test": scores,
        "loss_curve": curve,
    }
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
