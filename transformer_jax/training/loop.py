"""The training loop behind ``train.py``: data, state, steps, logs, checkpoints, evaluation.

``train_and_evaluate(config, workdir)`` trains ``config`` in ``workdir``, resuming from
the newest good checkpoint, and ends with loss, perplexity and BLEU on the test split.
Step ``s`` (counted from 1) uses the dropout key ``fold_in(seed_key, s)`` and the batch
after the saved iterator position, so a resumed run repeats an uninterrupted one exactly.
SIGTERM makes the loop checkpoint and exit after the current step; SIGUSR1 makes it save
the current parameters in ``{workdir}/snapshots/{step}`` and go on (translate and evaluate
load them with ``--checkpoint snapshots/STEP``).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tqdm import tqdm

from transformer_jax import data as data_lib
from transformer_jax.data.pipeline import make_batcher
from transformer_jax.inference.bleu import bleu
from transformer_jax.inference.translation import translate_lines
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.transformer import Transformer
from transformer_jax.training import checkpoints
from transformer_jax.training.logs import METRICS_FILE, MetricsWriter, read_metrics
from transformer_jax.training.loss import summarize
from transformer_jax.training.optimizer import transformer_optimizer, transformer_schedule
from transformer_jax.training.parallel import DataParallel
from transformer_jax.training.steps import TrainState, create_train_state
from transformer_jax.training.validation import validate_config


class _Signals:
    """Records SIGTERM (checkpoint and exit) and SIGUSR1 (save a parameter snapshot and
    go on) so that the loop can act on them between steps."""

    def __init__(self) -> None:
        self.stop = False
        self.snapshot = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        for signum in (signal.SIGTERM, signal.SIGUSR1):
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: no handlers
                break
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGTERM:
            self.stop = True
        else:
            self.snapshot = True

    def __exit__(self, *exc: Any) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


def init_state(model_config: TransformerConfig, config: ml_collections.ConfigDict) -> TrainState:
    """Fresh parameters (host numpy) and Adam state for ``config``."""
    model = Transformer(model_config)
    key = jax.random.PRNGKey(config.train.seed)
    init_key, dropout_key = jax.random.split(key)
    dummy = jnp.ones((1, 8), jnp.int32)
    params = jax.jit(lambda k: model.init(k, dummy, dummy)["params"])(init_key)
    schedule = transformer_schedule(
        model_config.d_model, config.train.warmup_steps, config.train.learning_rate_scale
    )
    tx = transformer_optimizer(
        schedule, config.train.adam_b1, config.train.adam_b2, config.train.adam_eps
    )
    return jax.device_get(create_train_state(params, tx, dropout_key))


def _train_items(state: TrainState) -> dict[str, Any]:
    return {"step": state.step, "opt_state": state.opt_state, "rng": state.rng}


def evaluate_loss(dp: DataParallel, params: Any, batches: list[dict]) -> dict[str, float]:
    """Loss, accuracy and perplexity over ``batches`` (exact token-weighted averages)."""
    sums = {"loss": 0.0, "nll": 0.0, "tokens": 0.0, "correct": 0.0}
    for batch in batches:
        metrics = jax.device_get(dp.eval_step(params, batch))
        for key in sums:
            sums[key] += float(metrics[key])
    return summarize(sums)


def translate_and_score(
    model_config: TransformerConfig,
    params: Any,
    tokenizer: Any,
    pairs: list[tuple[str, str]],
    decode: ml_collections.ConfigDict,
) -> tuple[float, list[str]]:
    """BLEU of the beam-search translations of ``pairs`` and the translations."""

    hypotheses = translate_lines(
        model_config,
        params,
        tokenizer,
        [source for source, _ in pairs],
        beam_size=decode.beam_size,
        alpha=decode.alpha,
        max_extra_len=decode.max_extra_len,
    )
    return bleu(hypotheses, [target for _, target in pairs]).score, hypotheses


def _check_finite(step: int, loss: float, checkpointer: checkpoints.Checkpointer) -> None:
    if not np.isfinite(loss):
        checkpointer.close()
        last = checkpointer.latest_step()
        kept = f"the last good checkpoint is step {last}" if last else "no checkpoint was saved"
        raise FloatingPointError(
            f"training loss is {loss} at step {step}; stopping ({kept} in {checkpointer.directory})"
        )


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Train (or resume) ``config`` in ``workdir``; returns the final evaluation results."""
    model_config = validate_config(config)
    is_main = jax.process_index() == 0
    os.makedirs(workdir, exist_ok=True)
    tokenizer = data_lib.get_tokenizer(config.data, workdir, config.model.vocab_size)
    if tokenizer.vocab_size > model_config.tgt_vocab:
        raise ValueError(
            f"model.vocab_size={model_config.tgt_vocab} is smaller than the tokenizer's "
            f"{tokenizer.vocab_size} pieces in {workdir}/tokenizer.model"
        )
    if is_main:
        with open(os.path.join(workdir, checkpoints.CONFIG_FILE), "w") as f:
            f.write(config.to_json(indent=2))

    model = Transformer(model_config)
    dp = DataParallel(config.train.parallel, model, config.train.label_smoothing)
    state = init_state(model_config, config)
    checkpointer = checkpoints.Checkpointer(workdir, config.train.keep_checkpoints)
    restored = checkpointer.restore_latest(state.params, _train_items(state))
    data_state = None
    if restored is not None:
        step, params, train, data_state = restored
        state = state.replace(params=params, **train)
        print(f"resuming from the checkpoint at step {step}")
    start = int(state.step)
    num_steps = config.train.num_steps
    if start >= num_steps:
        print(f"the run in {workdir} is complete: step {start} of train.num_steps={num_steps}")
        if _has_final_results(workdir, start):
            checkpointer.close()
            return {"step": start, "complete": True}
        print("its final evaluation is missing: evaluating")

    num_shards = jax.device_count()
    train_iter = data_lib.train_iterator(config.data, workdir, tokenizer, num_shards, data_state)
    stats = train_iter.stats()
    print(
        f"{stats['pairs']} training pairs ({stats['dropped_too_long']} longer than "
        f"data.max_len={config.data.max_len} dropped), {stats['batches_per_epoch']} batches "
        f"per epoch; vocabulary {tokenizer.vocab_size}; {jax.device_count()} device(s), "
        f"train.parallel={config.train.parallel}"
    )
    eval_batches = split_batches(config, workdir, tokenizer, num_shards, config.data.eval_split)
    dev_pairs = data_lib.load_pairs(config.data, config.data.eval_split)
    dev_pairs = dev_pairs[: config.train.eval_sentences]

    schedule = transformer_schedule(
        model_config.d_model, config.train.warmup_steps, config.train.learning_rate_scale
    )
    writer = MetricsWriter(workdir, start, enabled=is_main)
    base_rng = state.rng
    state = dp.replicate(state)
    accum = config.train.grad_accum_steps
    # sums over the steps since the last log; grad_norm is logged as the mean per step
    window = dict.fromkeys(("loss", "nll", "tokens", "correct", "grad_norm", "steps"), 0.0)
    window_real, window_slots, window_start = 0, 0, time.perf_counter()
    pending: tuple[int, dict] | None = None  # metrics of the last step, read one step late

    def read(step_metrics: tuple[int, dict]) -> dict[str, float]:
        step, metrics = step_metrics
        values = {k: float(v) for k, v in jax.device_get(metrics).items()}
        _check_finite(step, values["loss"] / max(values["tokens"], 1.0), checkpointer)
        values["steps"] = 1.0
        for key in window:
            window[key] += values[key]
        return values

    def save(step: int) -> None:
        host = dp.unreplicate(state)
        checkpointer.save(step, host.params, _train_items(host), train_iter.get_state())

    def log(step: int) -> dict[str, float]:
        nonlocal window_real, window_slots, window_start
        elapsed = time.perf_counter() - window_start
        record = summarize(window)
        record.update(
            grad_norm=window["grad_norm"] / max(window["steps"], 1.0),
            learning_rate=float(schedule(step - 1)),
            tokens_per_sec=window_real / max(elapsed, 1e-9),
            padding_efficiency=window_real / max(window_slots, 1),
            dropped_too_long=stats["dropped_too_long"],
        )
        writer.write(step, record)
        for key in window:
            window[key] = 0.0
        window_real, window_slots, window_start = 0, 0, time.perf_counter()
        return record

    bar = tqdm(total=num_steps, initial=start, desc="train", unit="step", disable=not is_main)
    with _Signals() as signals, bar:
        for step in range(start + 1, num_steps + 1):
            rng = jax.random.fold_in(base_rng, step)
            micro = [next(train_iter) for _ in range(accum)]
            for batch in micro:
                window_real += int(
                    np.count_nonzero(batch["src"]) + np.count_nonzero(batch["tgt_out"])
                )
                window_slots += batch["src"].size + batch["tgt_out"].size
            if accum == 1:
                state, metrics = dp.train_step(state, micro[0], rng)
            else:
                acc = dp.zero_accumulator(state)
                for i, batch in enumerate(micro):
                    acc = dp.accumulate(acc, state, batch, jax.random.fold_in(rng, i))
                state, metrics = dp.apply(state, acc)
            if pending is not None:
                values = read(pending)
                bar.set_postfix(
                    loss=f"{values['loss'] / max(values['tokens'], 1):.3f}",
                    lr=f"{float(schedule(pending[0] - 1)):.2e}",
                    tok_s=f"{window_real / max(time.perf_counter() - window_start, 1e-9):.0f}",
                )
            pending = (step, metrics)
            bar.update(1)
            boundary = step % config.train.log_every == 0 or step == num_steps
            checkpoint_now = (
                config.train.checkpoint_every and step % config.train.checkpoint_every == 0
            )
            evaluate_now = config.train.eval_every and step % config.train.eval_every == 0
            stopping = signals.stop  # read once: a signal arriving later waits for the next step
            if boundary or checkpoint_now or evaluate_now or stopping or step == num_steps:
                read(pending)
                pending = None
            if boundary:
                log(step)
            if checkpoint_now or stopping or step == num_steps:
                save(step)
            if signals.snapshot:
                signals.snapshot = False
                snapshots = os.path.join(workdir, checkpoints.SNAPSHOT_DIR)
                checkpoints.save_params(snapshots, dp.unreplicate(state.params), step)
                bar.write(f"SIGUSR1: saved the parameters of step {step} in {snapshots}")
            if stopping:
                bar.close()
                checkpointer.close()
                writer.close()
                print(f"SIGTERM: saved the checkpoint at step {step}; rerun to resume")
                return {"step": step, "complete": False}
            if evaluate_now and step < num_steps:
                record = _evaluate(
                    dp, model_config, state.params, tokenizer, eval_batches, dev_pairs, config
                )
                writer.write(step, record)
                bar.write(_describe(step, "dev", record))
                window_start = time.perf_counter()  # tokens/s counts training time only
    checkpointer.close()

    last = max(start, num_steps)
    record = _evaluate(dp, model_config, state.params, tokenizer, eval_batches, dev_pairs, config)
    print(_describe(last, "dev", record))
    if config.train.final_test:
        record.update(
            _test(dp, model_config, state.params, tokenizer, config, workdir, num_shards, last)
        )
    writer.write(last, record)
    writer.close()
    return {"step": last, "complete": True, **record}


def _has_final_results(workdir: str, step: int) -> bool:
    """Whether ``metrics.jsonl`` holds the final evaluation of ``step``."""
    if not os.path.isfile(os.path.join(workdir, METRICS_FILE)):
        return False
    return any(r["step"] == step and "eval_loss" in r for r in read_metrics(workdir))


def _test(
    dp: DataParallel,
    model_config: TransformerConfig,
    params: Any,
    tokenizer: Any,
    config: ml_collections.ConfigDict,
    workdir: str,
    num_shards: int,
    step: int,
) -> dict[str, float]:
    """Loss and perplexity on every test pair, BLEU of their translations, a few samples."""
    split = config.data.test_split
    batches = split_batches(config, workdir, tokenizer, num_shards, split)
    pairs = data_lib.load_pairs(config.data, split)
    if config.train.test_sentences:
        pairs = pairs[: config.train.test_sentences]
    test = evaluate_loss(dp, params, batches)
    test["bleu"], hypotheses = translate_and_score(
        model_config, dp.unreplicate(params), tokenizer, pairs, config.decode
    )
    print(_describe(step, f"test ({len(pairs)} sentences)", test))
    samples = list(zip(pairs, hypotheses, strict=True))[: config.train.samples]
    for (source, reference), hypothesis in samples:
        print(f"  source:      {source}\n  reference:   {reference}\n  translation: {hypothesis}")
    return {f"test_{k}": v for k, v in test.items()}


def split_batches(
    config: ml_collections.ConfigDict, workdir: str, tokenizer: Any, num_shards: int, split: str
) -> list[dict]:
    """Every pair of ``split`` once, batched like training (packed or bucketed)."""
    encoded = data_lib.encoded_split(config.data, split, tokenizer, workdir)
    return data_lib.eval_batches(make_batcher(config.data, encoded, num_shards))


def _evaluate(
    dp: DataParallel,
    model_config: TransformerConfig,
    params: Any,
    tokenizer: Any,
    eval_batches: list[dict],
    dev_pairs: list[tuple[str, str]],
    config: ml_collections.ConfigDict,
) -> dict[str, float]:
    """Dev loss, perplexity and accuracy on every dev pair; BLEU on ``dev_pairs``.

    ``params`` are the replicated device parameters of ``dp``.
    """
    record = evaluate_loss(dp, params, eval_batches)
    if dev_pairs:
        host = dp.unreplicate(params)
        record["bleu"], _ = translate_and_score(
            model_config, host, tokenizer, dev_pairs, config.decode
        )
    return {f"eval_{k}": v for k, v in record.items()}


def _describe(step: int, split: str, record: dict[str, float]) -> str:
    values = ", ".join(f"{k.split('_', 1)[-1]} {v:.4g}" for k, v in record.items())
    return f"step {step} {split}: {values}"
