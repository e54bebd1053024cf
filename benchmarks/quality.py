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

``--vs-torch`` first runs the PyTorch baseline (``../shared/bench/multi30k_torch.py``, a
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
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
from _common import ROOT, describe_machine, machine, table, write_json

from transformer_jax.cli.average import average_checkpoints
from transformer_jax.cli.common import shared_tokenizer
from transformer_jax.cli.train import EXIT_PREEMPTED
from transformer_jax.data import load_pairs
from transformer_jax.data.pipeline import eval_split_batches
from transformer_jax.inference.bleu import bleu
from transformer_jax.inference.translation import translate_lines
from transformer_jax.model.config import from_config_dict
from transformer_jax.model.transformer import Transformer
from transformer_jax.training.checkpoints import SNAPSHOT_DIR, list_steps, load_run
from transformer_jax.training.evaluator import evaluate_loss
from transformer_jax.training.logs import RUN_INFO_FILE, read_metrics, read_run_info
from transformer_jax.training.parallel import DataParallel

DEFAULT_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data", "multi30k")
DEFAULT_CONFIG = os.path.join(ROOT, "configs", "multi30k.py")
DEFAULT_TORCH_SCRIPT = os.path.join(os.path.dirname(ROOT), "shared", "bench", "multi30k_torch.py")
TORCH_ARGS = "--warmup 200 --lr_scale 0.5"  # the baseline's settings for a 30-minute budget
# The files the baseline reads: {split}.{lang} for these splits and languages.
TORCH_DATA = {"train_split": "train", "eval_split": "val", "test_split": "test_2016_flickr"}
TORCH_LANGS = {"src_lang": "en", "tgt_lang": "de"}
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


def train_within_budget(
    command: list[str], marks: list[float], log_path: str, clock_file: str | None = None
) -> dict[str, Any]:
    """Run ``command``; at each of ``marks`` (minutes, ascending) but the last send SIGUSR1
    (the loop saves a parameter snapshot and goes on), at the last SIGTERM (the loop
    checkpoints and exits with ``EXIT_PREEMPTED``). The minutes count from the start of
    ``command``, or with ``clock_file`` from when that file appears. Returns timings."""
    return train_side_by_side([command], marks, [log_path], [clock_file])[0]


def train_side_by_side(
    commands: list[list[str]],
    marks: list[float],
    log_paths: list[str],
    clock_files: list[str | None],
    cpus: list[set[int]] | None = None,
) -> list[dict[str, Any]]:
    """:func:`train_within_budget` for several commands at once, each with its own clock
    (and, with ``cpus``, on its own CPU cores). Returns each one's timings."""
    launched, n = time.perf_counter(), len(commands)
    starts: list[float | None] = [None] * n
    ends: list[float | None] = [None] * n  # when the last mark was signalled, or the exit
    signalled, stopped, exited = [0] * n, [False] * n, [0.0] * n
    if cpus is not None:
        commands = [pinned(command, c) for command, c in zip(commands, cpus, strict=True)]
    logs = [open(path, "w") for path in log_paths]  # noqa: SIM115  (closed below)
    try:
        procs = [
            subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
            for command, log in zip(commands, logs, strict=True)
        ]
        while not all(exited):
            now = time.perf_counter()
            for i, proc in enumerate(procs):
                if exited[i]:
                    continue
                running = proc.poll() is None
                if starts[i] is None and (
                    not clock_files[i] or os.path.exists(clock_files[i]) or not running
                ):
                    starts[i] = launched if not clock_files[i] else now
                if not running:
                    exited[i], ends[i] = now, ends[i] or now
                    continue
                while starts[i] is not None and signalled[i] < len(marks):
                    if now - starts[i] < marks[signalled[i]] * 60:
                        break
                    last = signalled[i] == len(marks) - 1
                    proc.send_signal(signal.SIGTERM if last else signal.SIGUSR1)
                    stopped[i], ends[i] = last, now if last else None
                    signalled[i] += 1
            time.sleep(0.02)
        returncodes = [proc.wait() for proc in procs]
    finally:
        for log in logs:
            log.close()
    for path, returncode, stop in zip(log_paths, returncodes, stopped, strict=True):
        if returncode != 0 and not (stop and returncode == EXIT_PREEMPTED):
            with open(path) as f:
                tail = f.read()[-3000:]
            hint = " (the budget ended before the training loop started?)" if stop else ""
            raise RuntimeError(f"training failed (exit {returncode}){hint}; end of {path}:\n{tail}")
    return [
        {
            "setup_s": starts[i] - launched,  # before the clock started (0 without a clock file)
            "train_wall_s": ends[i] - starts[i],
            "exit_wall_s": exited[i] - starts[i],
            "stopped_by_budget": stopped[i],
        }
        for i in range(n)
    ]


def combined(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's timings and summary; of several side by side: the longest clock, and the
    sums of their steps, epochs and token rates (the first one's ``run_info``)."""
    if len(summaries) == 1:
        return {k: v for k, v in summaries[0].items() if k != "workdir"}
    total = lambda key: sum(s[key] for s in summaries)  # noqa: E731
    return {
        **{
            key: max(s[key] for s in summaries)
            for key in ("setup_s", "train_wall_s", "exit_wall_s")
        },
        "stopped_by_budget": all(s["stopped_by_budget"] for s in summaries),
        "step": total("step"),
        "run_info": summaries[0]["run_info"],
        **{key: total(key) for key in ("epochs", "median_tokens_per_sec", "target_tokens_per_sec")},
    }


def pinned(command: list[str], cpus: set[int]) -> list[str]:
    """``command`` run on the CPU cores ``cpus`` only (set in a Python process that then
    becomes the command, so no code runs between fork and exec in this one)."""
    pin = "import os, sys; os.sched_setaffinity(0, {}); os.execvp(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", pin.format(sorted(cpus)), *command]


def member_cpus(members: int) -> list[set[int]]:
    """This process's CPU cores split into ``members`` equal contiguous shares."""
    cores = sorted(os.sched_getaffinity(0))
    if members > len(cores):
        raise ValueError(
            f"--ensemble {members} needs a core per model; this process has {len(cores)}"
        )
    share = len(cores) // members
    return [set(cores[i * share : (i + 1) * share]) for i in range(members)]


def run_summary(workdir: str, step: int, train_wall_s: float) -> dict[str, Any]:
    """What the run's files say about its training: ``run_info.json`` (pairs, batches and
    tokens per epoch, ...), epochs, the median of the logged tokens/s (source + target,
    training time only) and the target tokens per second of the budget (as the baseline
    counts them: every trained target token with its EOS, over the clock's seconds)."""
    info = read_run_info(workdir)
    epochs = step / info["batches_per_epoch"]
    speeds = [r["tokens_per_sec"] for r in loss_curve(workdir)[1:]] or [float("nan")]
    return {
        "run_info": info,
        "epochs": epochs,
        "median_tokens_per_sec": sorted(speeds)[len(speeds) // 2],
        "target_tokens_per_sec": epochs * info["target_tokens_per_epoch"] / train_wall_s,
    }


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


def check_vs_torch(args: argparse.Namespace, marks: list[float]) -> None:
    """ValueError, before anything runs, if the baseline cannot run as asked."""
    if len(marks) > 1:
        raise ValueError(f"--vs-torch compares one budget, got --minutes {args.minutes}")
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

    dp = DataParallel(
        config.train.parallel, Transformer(model_config), config.train.label_smoothing
    )
    batches, _ = eval_split_batches(config.data, workdir, tokenizer, dp.num_devices)
    return evaluate_loss(dp, dp.replicate(params), batches)


def members_dev(rows: list[dict[str, Any]], checkpoint: str) -> dict[str, float]:
    """The mean of the members' dev metrics at ``checkpoint``, from their score rows."""

    alone = list({r["model"]: r for r in rows if r["checkpoint"] == checkpoint}.values())
    keys = [key for key in alone[0] if key.startswith("dev_")]
    return {key.removeprefix("dev_"): sum(r[key] for r in alone) / len(alone) for key in keys}


def evaluate(
    workdirs: list[str],
    split: str,
    beams: list[int],
    checkpoint: str,
    minutes: float,
    model: str = "single",
    dev: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """sacreBLEU on ``split`` of one checkpoint ('latest', 'averaged' or 'snapshots/STEP',
    the parameters after ``minutes`` of training), per beam size, with its dev metrics
    (measured here for one run; an ensemble's are given, the mean of its members').
    Several workdirs are decoded as an ensemble (the mean of their models' probabilities);
    its step is the sum of theirs."""

    loaded = [load_run(workdir, checkpoint) for workdir in workdirs]
    config = loaded[0][0]
    model_configs = [from_config_dict(run.model) for run, _, _ in loaded]
    tokenizer = shared_tokenizer(workdirs, model_configs[0].tgt_vocab)
    params = [p for _, p, _ in loaded]
    if len(workdirs) == 1:
        model_configs, params = model_configs[0], params[0]
        if dev is None:
            dev = dev_metrics(config, model_configs, params, tokenizer, workdirs[0])
    elif dev is None:
        raise ValueError("an ensemble's dev metrics are its members' mean: pass dev")
    pairs = load_pairs(config.data, split)
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    rows = []
    for beam in beams:
        start = time.perf_counter()
        hypotheses = translate_lines(
            model_configs,
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
                "model": model,
                "checkpoint": checkpoint,
                "step": sum(int(step) for _, _, step in loaded),
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
        "--torch-script", default=DEFAULT_TORCH_SCRIPT, help="the baseline (--vs-torch)"
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
    args, passthrough = parser.parse_known_args(argv)
    unknown = [a for a in passthrough if not a.startswith("--config.")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    marks = parse_marks(args.minutes)
    if not os.path.isdir(args.data_dir):
        raise ValueError(f"--data-dir {args.data_dir!r} is not a directory")
    if os.path.isdir(args.workdir) and os.listdir(args.workdir):
        raise ValueError(f"--workdir {args.workdir!r} is not empty: time-to-BLEU needs a new run")
    if args.vs_torch:
        check_vs_torch(args, marks)
    if args.ensemble < 1 or (args.ensemble > 1 and len(marks) > 1):
        raise ValueError(f"--ensemble takes N >= 1 and one budget, got {args.ensemble} and "
                         f"--minutes {args.minutes}")  # fmt: skip
    cpus = member_cpus(args.ensemble) if args.ensemble > 1 else None
    beams = [int(b) for b in args.beams.split(",")]
    clock = args.clock or ("loop" if args.vs_torch else "process")

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
        "train.final_test": False,  # scored below; a run that ends early must not decode
        **(SMOKE_OVERRIDES if args.smoke else {}),
    }
    command = [sys.executable, os.path.join(ROOT, "train.py"), f"--config={args.config}"]
    command += [*(f"--config.{k}={v}" for k, v in overrides.items()), *passthrough]
    members = [workdir]
    if args.ensemble > 1:
        members = [os.path.join(workdir, f"member{i}") for i in range(args.ensemble)]
    info = machine()
    print(f"machine: {describe_machine(info)}")
    baseline = None
    if args.vs_torch:
        torch_dir = os.path.join(workdir, "torch_baseline")
        torch_command = [sys.executable, args.torch_script, "--minutes", f"{marks[-1]:g}"]
        torch_command += [*shlex.split(args.torch_args), "--data_dir", overrides["data.text_dir"]]
        torch_command += ["--work_dir", torch_dir]
        print(f"the baseline, {marks[-1]:g} min of training:\n  {' '.join(torch_command)}")
        os.makedirs(torch_dir)
        baseline = run_torch(torch_command, os.path.join(torch_dir, "output.log"))
        baseline["command"] = torch_command
        print(f"baseline: step {baseline['steps']}, BLEU by beam {baseline['bleu']}")
    counted = "its training loop" if clock == "loop" else "all of train.py"
    commands = [
        [*command, f"--workdir={member}"]
        + ([f"--config.train.seed={i}", f"--config.data.seed={i}"] if len(members) > 1 else [])
        for i, member in enumerate(members)
    ]
    for member, member_command in zip(members, commands, strict=True):
        os.makedirs(member, exist_ok=True)
        print(f"training for at most {marks[-1]:g} min of {counted}:\n  {' '.join(member_command)}")
    log_paths = [os.path.join(member, "train.log") for member in members]
    clock_files = [os.path.join(m, RUN_INFO_FILE) if clock == "loop" else None for m in members]
    timings = train_side_by_side(commands, marks, log_paths, clock_files, cpus)

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
            f"step {step}, {summaries[-1]['epochs']:.2f} epochs; log {log_paths[i]}"
        )
    if len(members) > 1:
        together = []
        for checkpoint in ("latest", "averaged") if args.average > 1 else ("latest",):
            dev = members_dev(scores, checkpoint)
            together += evaluate(
                members, args.test_split, beams, checkpoint, marks[-1], "ensemble", dev
            )
        scores = together + scores
    curve = loss_curve(members[0])
    print(
        table(
            [
                "minutes",
                "model",
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
                    r["model"],
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


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:  # a usage mistake: one line, nothing run
        sys.exit(f"quality.py: {e}")
