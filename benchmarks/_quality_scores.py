"""quality.py's measurements of a finished run: sacreBLEU of its checkpoints (alone or as an
ensemble), dev metrics as ``train.py`` measures them, and what the run's files say about its
training (epochs, token rates, the loss curve).
"""

from __future__ import annotations

import time
from typing import Any

from _common import table

from transformer_jax.data import load_pairs
from transformer_jax.data.batching import TrainIterator
from transformer_jax.data.pipeline import encoded_split, eval_split_batches, make_batcher
from transformer_jax.inference.bleu import bleu
from transformer_jax.inference.runs import shared_tokenizer
from transformer_jax.inference.translation import translate_lines
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.transformer import Transformer
from transformer_jax.training.checkpoints import load_config, load_run
from transformer_jax.training.evaluator import evaluate_loss
from transformer_jax.training.logs import read_metrics, read_run_info
from transformer_jax.training.mesh import run_parallel
from transformer_jax.training.schema import RunConfig, resolve_auto


def run_summary(workdir: str, step: int, train_wall_s: float) -> dict[str, Any]:
    """What the run's files say about its training: ``run_info.json`` (pairs, batches and
    tokens per epoch, ...), epochs, the median of the logged tokens/s (source + target,
    training time only) and the target tokens per second of the budget (as the baseline
    counts them: every trained target token with its EOS, over the clock's seconds)."""
    info = read_run_info(workdir)
    epochs = step / batches_per_epoch(workdir, info)
    speeds = [r["tokens_per_sec"] for r in loss_curve(workdir)[1:]] or [float("nan")]
    return {
        "run_info": info,
        "epochs": epochs,
        "median_tokens_per_sec": sorted(speeds)[len(speeds) // 2],
        "target_tokens_per_sec": epochs * info["target_tokens_per_epoch"] / train_wall_s,
    }


def batches_per_epoch(workdir: str, info: dict[str, Any]) -> int:
    """The run's batches per epoch: ``run_info``'s, or for packed batches (planned as they
    are read, so not counted when a run starts) those of its first epoch, counted here."""
    if info["batches_per_epoch"] is not None:
        return info["batches_per_epoch"]
    config = load_config(workdir)
    tokenizer = shared_tokenizer([workdir], config.model.tgt_vocab)
    encoded = encoded_split(config.data, config.data.train_split, tokenizer, workdir)
    batcher = make_batcher(config.data, encoded, info["devices"])
    return len(TrainIterator(batcher, config.data.seed).epoch_plan(0))


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


def loss_curve(workdir: str, points: int = 12) -> list[dict[str, Any]]:
    """About ``points`` records of ``metrics.jsonl`` (evenly spaced, the last included)."""
    records = [r for r in read_metrics(workdir) if "loss" in r and "tokens_per_sec" in r]
    if len(records) <= points:
        return records
    stride = len(records) / points
    chosen = [records[int(i * stride)] for i in range(points)]
    return chosen if chosen[-1] is records[-1] else [*chosen, records[-1]]


def dev_metrics(
    config: RunConfig, model_config: TransformerConfig, params: Any, tokenizer: Any, workdir: str
) -> dict[str, float]:
    """Loss (label-smoothed), perplexity and accuracy of ``params`` on every pair of the
    run's dev split (``config.data.eval_split``), measured as ``train.py`` measures them."""

    dp = run_parallel(config.train, Transformer(model_config))
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
    model_configs = [resolve_auto(run.model) for run, _, _ in loaded]
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


def print_scores(scores: list[dict[str, Any]], test_split: str) -> None:
    """The score rows as a table, then the sacreBLEU signature and one example."""
    headers = ["minutes", "model", "test split", "sentences", "checkpoint", "step", "beam"]
    headers += ["sacreBLEU", "decode s", "dev loss", "dev ppl"]
    keys = ["sentences", "checkpoint", "step", "beam", "bleu", "decode_s", "dev_loss"]
    rows = [
        [r["minutes"], r["model"], test_split, *(r[k] for k in keys), r["dev_perplexity"]]
        for r in scores
    ]
    print(table(headers, rows))
    print(f"signature: {scores[0]['signature']}")
    print(f"example: {scores[0]['example']}")


def print_curve(curve: list[dict[str, Any]]) -> None:
    """The loss curve (records of ``metrics.jsonl``) as a table."""
    if not curve:
        print("\nno training log records (fewer steps than train.log_every)")
    print("\nloss curve (metrics.jsonl; tokens/s = real source + target tokens per second):")
    nan = float("nan")
    rows = [
        [
            r["step"],
            r["loss"],
            r.get("accuracy", nan),
            f"{r.get('learning_rate', nan):.2e}",
            r["tokens_per_sec"],
            r.get("padding_efficiency", nan),
        ]
        for r in curve
    ]
    headers = ["step", "loss", "accuracy", "learning rate", "tokens/s", "padding efficiency"]
    print(table(headers, rows))
