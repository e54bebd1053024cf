"""Time to BLEU: train on a ``{split}.{lang}`` text directory for a wall-clock budget, then
score the test split with sacreBLEU (beam search, the project's own decoding).

The run is the project's own command, ``python train.py --config configs/multi30k.py``
(any ``--config.<section>.<field>=value`` given here is passed on), started in a fresh
workdir. The budget counts everything that command does (``--clock process``): tokenizer
training, encoding the data, compilation and the steps. When it is spent, the trainer gets
SIGTERM, which makes the training loop finish its step, save a checkpoint and exit. The newest
checkpoint is then translated (``transformer_jax.inference.translation.translate_lines``, beam 4 and
greedy) and scored (``transformer_jax.inference.bleu.bleu``), and its loss, perplexity and
accuracy on every dev pair are measured (dev loss rising while training loss falls is
over-fitting, the thing to tune against); with ``--average N`` so is the mean of the
last N checkpoints (``transformer_jax.average``, paper §6.1). With ``--minutes 30,60``
the run also gets SIGUSR1 at 30 minutes, saves its parameters then and goes on; that
snapshot is scored too: one run reports both budgets. Evaluation is not counted in the
budget. Reported: BLEU, steps, epochs, the training loop's tokens/s and the loss
curve, read from the files the run writes (``{workdir}/run_info.json`` and
``metrics.jsonl``).

``--vs-torch`` first runs the PyTorch baseline (``--torch-script PATH``, a script training a
plain ``torch.nn.Transformer`` of the same size) for the same minutes on the same data,
then the project's run, and prints both side by side with the difference. The baseline's
clock counts its training steps only (not its tokenizer, encoding, validation or
decoding); so that both budgets count the same thing, the project's clock then starts when
its training loop starts (``--clock loop``: tokenizer and encoding not counted,
compilation counted, as it is part of training in JAX).

``--ensemble N`` trains N models side by side for the same budget, each a ``train.py``
process in ``{workdir}/member{i}`` with ``train.seed = data.seed = i`` on its own share of
the CPU cores, then decodes them together (the mean of their next-token probabilities,
``transformer_jax.inference.decoding``); each is also scored alone.

    python benchmarks/quality.py --minutes 30 --workdir runs/multi30k-30min
    python benchmarks/quality.py --minutes 30,60 --workdir runs/multi30k-60min --json out.json
    python benchmarks/quality.py --minutes 30 --vs-torch --workdir runs/vs-torch-30min
    python benchmarks/quality.py --minutes 60 --vs-torch --config configs/multi30k.py:60 \
        --average 5 --workdir runs/vs-torch-60min
    python benchmarks/quality.py --minutes 60 --vs-torch --config configs/multi30k.py:60x2 \
        --average 5 --ensemble 2 --workdir runs/vs-torch-60min-ensemble
    python benchmarks/quality.py --minutes 30 --data-dir DIR --src-lang en --tgt-lang fr

The data: ``--data-dir`` (default ``data/multi30k`` in the clone, written by ``python -m
transformer_jax.download multi30k --dest data/multi30k``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
from _common import ROOT, describe_machine, machine, write_json
from _quality_baseline import (
    TORCH_ARGS,
    TORCH_DATA,
    TORCH_LANGS,
    compare,
    print_comparison,
    run_torch,
)
from _quality_budget import member_cpus, parse_marks, train_side_by_side
from _quality_scores import (
    combined,
    evaluate,
    loss_curve,
    members_dev,
    print_curve,
    print_scores,
    run_summary,
)

from transformer_jax.cli.average import average_checkpoints
from transformer_jax.training.checkpoints import SNAPSHOT_DIR, list_steps
from transformer_jax.training.logs import RUN_INFO_FILE

DEFAULT_DATA = os.path.join(ROOT, "data", "multi30k")
DOWNLOAD = "python -m transformer_jax.download multi30k --dest data/multi30k"
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Other --config.<section>.<field>=value arguments are passed to train.py.",
    )
    parser.add_argument(
        "--minutes",
        required=True,
        help="training budget; a comma list (30,60) also scores a snapshot at each earlier mark",
    )
    parser.add_argument(
        "--data-dir",
        default=DEFAULT_DATA,
        help="{split}.{lang} text files (default: data/multi30k in the clone)",
    )
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
    parser.add_argument(
        "--clock",
        choices=("process", "loop"),
        help="what the budget counts: all of train.py (process; the default) or its training "
        "loop from its start, compilation included (loop; the default with --vs-torch)",
    )
    parser.add_argument(
        "--vs-torch",
        action="store_true",
        help="first run the PyTorch baseline for the same minutes; print both side by side",
    )
    parser.add_argument(
        "--torch-script", help="the baseline script that --vs-torch runs (required with it)"
    )
    parser.add_argument(
        "--torch-args", default=TORCH_ARGS, help="the baseline's other arguments (--vs-torch)"
    )
    parser.add_argument(
        "--ensemble",
        type=int,
        default=1,
        help="train N models side by side in {workdir}/member{i} (train.seed = data.seed = i, "
        "each on 1/N of the CPU cores) and decode them as an ensemble; each is scored alone too",
    )
    parser.add_argument("--json", help="write the results to this file")
    return parser


def check_args(args: argparse.Namespace) -> list[float]:
    """ValueError, before anything runs, for a mistaken command; the budget's marks."""
    marks = parse_marks(args.minutes)
    if not os.path.isdir(args.data_dir):
        hint = f" (get Multi30k with: {DOWNLOAD})" if args.data_dir == DEFAULT_DATA else ""
        raise ValueError(f"--data-dir {args.data_dir!r} is not a directory{hint}")
    if os.path.isdir(args.workdir) and os.listdir(args.workdir):
        raise ValueError(f"--workdir {args.workdir!r} is not empty: time-to-BLEU needs a new run")
    if args.vs_torch:
        check_vs_torch(args, marks)
    if args.ensemble < 1 or (args.ensemble > 1 and len(marks) > 1):
        raise ValueError(f"--ensemble takes N >= 1 and one budget, got {args.ensemble} and "
                         f"--minutes {args.minutes}")  # fmt: skip
    return marks


def check_vs_torch(args: argparse.Namespace, marks: list[float]) -> None:
    """ValueError, before anything runs, if the baseline cannot run as asked."""
    if len(marks) > 1:
        raise ValueError(f"--vs-torch compares one budget, got --minutes {args.minutes}")
    if not args.torch_script:
        raise ValueError("--vs-torch needs --torch-script PATH (the baseline script)")
    if not os.path.isfile(args.torch_script):
        raise ValueError(f"--vs-torch: no baseline script at {args.torch_script} (--torch-script)")
    if not torch_installed():
        raise ValueError("--vs-torch: torch is not installed (pip install torch)")
    for field, expected in {**TORCH_DATA, **TORCH_LANGS}.items():
        if (value := getattr(args, field)) != expected:
            flag = "--" + field.replace("_", "-")
            raise ValueError(
                f"--vs-torch: the baseline reads only {TORCH_DATA['train_split']}, "
                f"{TORCH_DATA['eval_split']} and {TORCH_DATA['test_split']} in "
                f"{TORCH_LANGS['src_lang']}->{TORCH_LANGS['tgt_lang']}; got {flag} {value}"
            )


def torch_installed() -> bool:
    return importlib.util.find_spec("torch") is not None


def train_commands(
    args: argparse.Namespace, passthrough: list[str], workdir: str
) -> tuple[list[list[str]], list[str]]:
    """The ``train.py`` command of each model and its workdir (``member{i}`` in an ensemble,
    each with ``train.seed = data.seed = i``)."""
    overrides = {
        "data.source": "text",
        "data.text_dir": os.path.abspath(args.data_dir),
        "data.src_lang": args.src_lang,
        "data.tgt_lang": args.tgt_lang,
        "data.train_split": args.train_split,
        "data.eval_split": args.eval_split,
        "data.test_split": args.test_split,
        "train.final_test": False,  # scored below; a run that ends early must not decode
        **(SMOKE_OVERRIDES if args.smoke else {}),
    }
    command = [sys.executable, os.path.join(ROOT, "train.py"), f"--config={args.config}"]
    command += [*(f"--config.{k}={v}" for k, v in overrides.items()), *passthrough]
    members = [workdir]
    if args.ensemble > 1:
        members = [os.path.join(workdir, f"member{i}") for i in range(args.ensemble)]
    commands = [
        [*command, f"--workdir={member}"]
        + ([f"--config.train.seed={i}", f"--config.data.seed={i}"] if len(members) > 1 else [])
        for i, member in enumerate(members)
    ]
    return commands, members


def run_baseline(args: argparse.Namespace, minutes: float, workdir: str) -> dict[str, Any]:
    """The PyTorch baseline run for ``minutes`` of training in ``{workdir}/torch_baseline``."""
    torch_dir = os.path.join(workdir, "torch_baseline")
    torch_command = [sys.executable, args.torch_script, "--minutes", f"{minutes:g}"]
    torch_command += [*shlex.split(args.torch_args), "--data_dir", os.path.abspath(args.data_dir)]
    torch_command += ["--work_dir", torch_dir]
    print(f"the baseline, {minutes:g} min of training:\n  {' '.join(torch_command)}")
    os.makedirs(torch_dir)
    baseline = run_torch(torch_command, os.path.join(torch_dir, "output.log"))
    baseline["command"] = torch_command
    print(f"baseline: step {baseline['steps']}, BLEU by beam {baseline['bleu']}")
    return baseline


def score_members(
    args: argparse.Namespace,
    members: list[str],
    timings: list[dict[str, Any]],
    marks: list[float],
    counted: str,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]]:
    """Each model's score rows (its snapshots, newest and averaged checkpoints), its summary,
    and the steps of the last averaged checkpoints; an ensemble's rows come first."""
    beams = [int(b) for b in args.beams.split(",")]
    scores, summaries, averaged = [], [], []
    for i, (member, timing) in enumerate(zip(members, timings, strict=True)):
        model = "single" if len(members) == 1 else f"member {i}"
        step = list_steps(member)[-1]
        snapshots = list_steps(member, SNAPSHOT_DIR) if len(marks) > 1 else []
        for minutes, snapshot in zip(marks, snapshots, strict=False):
            checkpoint = f"{SNAPSHOT_DIR}/{snapshot}"
            scores += evaluate([member], args.test_split, beams, checkpoint, minutes, model)
        scores += evaluate([member], args.test_split, beams, "latest", marks[-1], model)
        if args.average > 1:
            averaged, _ = average_checkpoints(member, min(args.average, len(list_steps(member))))
            print(f"{model}: averaged the checkpoints of steps {averaged}")
            scores += evaluate([member], args.test_split, beams, "averaged", marks[-1], model)
        summaries.append({"workdir": member, "step": step, **timing})
        summaries[-1].update(run_summary(member, step, timing["train_wall_s"]))
        print(
            f"\n{model}: trained {timing['train_wall_s'] / 60:.1f} min of {counted} "
            f"({'stopped by the budget' if timing['stopped_by_budget'] else 'finished'}): "
            f"step {step}, {summaries[-1]['epochs']:.2f} epochs; log {member}/train.log"
        )
    if len(members) > 1:
        together = []
        for checkpoint in ("latest", "averaged") if args.average > 1 else ("latest",):
            dev = members_dev(scores, checkpoint)
            together += evaluate(
                members, args.test_split, beams, checkpoint, marks[-1], "ensemble", dev
            )
        scores = together + scores
    return scores, summaries, averaged


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args, passthrough = parser.parse_known_args(argv)
    if unknown := [a for a in passthrough if not a.startswith("--config.")]:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    marks = check_args(args)
    cpus = member_cpus(args.ensemble) if args.ensemble > 1 else None
    clock = args.clock or ("loop" if args.vs_torch else "process")
    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    commands, members = train_commands(args, passthrough, workdir)
    info = machine()
    print(f"machine: {describe_machine(info)}")
    baseline = run_baseline(args, marks[-1], workdir) if args.vs_torch else None
    counted = "its training loop" if clock == "loop" else "all of train.py"
    for member, member_command in zip(members, commands, strict=True):
        os.makedirs(member, exist_ok=True)
        print(f"training for at most {marks[-1]:g} min of {counted}:\n  {' '.join(member_command)}")
    log_paths = [os.path.join(member, "train.log") for member in members]
    clock_files = [os.path.join(m, RUN_INFO_FILE) if clock == "loop" else None for m in members]
    timings = train_side_by_side(commands, marks, log_paths, clock_files, cpus)
    scores, summaries, averaged = score_members(args, members, timings, marks, counted)
    curve = loss_curve(members[0])
    print_scores(scores, args.test_split)
    print_curve(curve)
    payload = {
        "machine": info,
        "command": commands[0] if len(commands) == 1 else commands,
        "minutes": marks,
        "clock": clock,
        **combined(summaries),
        "averaged_steps": averaged,
        "test": scores,
        "loss_curve": curve,
    }
    if len(members) > 1:
        payload["members"] = summaries
    if baseline is not None:
        rows = compare(payload, baseline)
        print_comparison(rows, args.test_split, os.path.basename(args.torch_script), clock)
        if len(members) > 1:
            print(
                f"the project: an ensemble of {len(members)} models trained side by side, each "
                "on its share of the cores; steps, epochs and tokens/s are the sums of theirs, "
                "dev losses the mean of theirs (each model alone)."
            )
        payload["vs_torch"] = {"baseline": baseline, "comparison": rows}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:  # a usage mistake: one line, nothing run
        sys.exit(f"quality.py: {e}")
