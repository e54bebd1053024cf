"""Evaluation during and after training: loss, perplexity and accuracy on every pair of a
split, BLEU of beam-search translations, sample translations."""

from __future__ import annotations

from typing import Any

import jax

from transformer_jax import data as data_lib
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.inference.bleu import bleu
from transformer_jax.inference.config import DecodeConfig
from transformer_jax.inference.translation import translate_on_devices
from transformer_jax.model.config import TransformerConfig
from transformer_jax.training.logs import say
from transformer_jax.training.loss import summarize
from transformer_jax.training.parallel import Parallel
from transformer_jax.training.schema import RunConfig

Pair = tuple[str, str]


def evaluate_loss(dp: Parallel, params: Any, batches: list[dict]) -> dict[str, float]:
    """Loss, accuracy and perplexity over ``batches`` (exact token-weighted averages)."""
    sums = dict.fromkeys(("loss", "cross_entropy", "nll", "tokens", "correct"), 0.0)
    for batch in batches:
        metrics = jax.device_get(dp.eval_step(params, batch))
        for key in sums:
            sums[key] += float(metrics[key])
    return summarize(sums)


def translate_and_score(
    model_config: TransformerConfig,
    device_params: list[Any],
    tokenizer: Tokenizer,
    pairs: list[Pair],
    decode: DecodeConfig,
) -> tuple[float, list[str]]:
    """BLEU of the beam-search translations of ``pairs`` and the translations, decoded over
    the local devices and the processes (``inference.translation.translate_on_devices``)."""
    hypotheses = translate_on_devices(
        model_config,
        device_params,
        tokenizer,
        [source for source, _ in pairs],
        beam_size=decode.beam_size,
        alpha=decode.alpha,
        max_extra_len=decode.max_extra_len,
    )
    return bleu(hypotheses, [target for _, target in pairs]).score, hypotheses


def describe(step: int, split: str, record: dict[str, float]) -> str:
    """``step S split: loss 1.23, perplexity 3.4, ...`` (the keys' prefixes dropped)."""
    names = {k: k.removeprefix("eval_").removeprefix("test_") for k in record}
    values = ", ".join(f"{names[k]} {v:.4g}" for k, v in record.items())
    return f"step {step} {split}: {values}"


class _Split:
    """Batches of every pair of one split and the pairs translated for BLEU."""

    def __init__(
        self, config: RunConfig, workdir: str, tokenizer: Tokenizer, num_shards: int, field: str
    ):
        split = getattr(config.data, field)
        self.batches, counts = data_lib.eval_split_batches(
            config.data, workdir, tokenizer, num_shards, split
        )
        if not self.batches:
            raise ValueError(
                f"data.{field}={split!r} has no pair to evaluate on ({counts['pairs']} kept, "
                f"{counts['dropped_too_long']} longer than data.max_len={config.data.max_len})"
            )
        self.pairs = data_lib.load_pairs(config.data, split)


class Evaluator:
    """What evaluation needs (the dev split, the test split if ``train.final_test``), read
    when the run starts so that a missing split fails before the first step."""

    def __init__(
        self,
        config: RunConfig,
        workdir: str,
        dp: Parallel,
        model_config: TransformerConfig,
        tokenizer: Tokenizer,
    ):
        self.config, self.dp, self.model_config, self.tokenizer = (
            config,
            dp,
            model_config,
            tokenizer,
        )
        num_shards = jax.device_count()
        self.dev_split = _Split(config, workdir, tokenizer, num_shards, "eval_split")
        self.dev_pairs = self.dev_split.pairs[: config.train.eval_sentences]
        self.test_split = None
        if config.train.final_test:
            self.test_split = _Split(config, workdir, tokenizer, num_shards, "test_split")

    def dev(self, params: Any) -> dict[str, float]:
        """``eval_*`` loss, perplexity and accuracy on every dev pair, BLEU on the first
        ``train.eval_sentences``; ``params`` are replicated device parameters."""
        record = evaluate_loss(self.dp, params, self.dev_split.batches)
        if self.dev_pairs:
            record["bleu"], _ = translate_and_score(
                self.model_config,
                self.dp.local_copies(params),
                self.tokenizer,
                self.dev_pairs,
                self.config.decode,
            )
        return {f"eval_{k}": v for k, v in record.items()}

    def test(self, params: Any, step: int) -> dict[str, float]:
        """``test_*`` loss and perplexity on every test pair, BLEU of the first
        ``train.test_sentences`` (0: all); prints the result and a few samples."""
        assert self.test_split is not None, "train.final_test is off"
        pairs = self.test_split.pairs
        if self.config.train.test_sentences:
            pairs = pairs[: self.config.train.test_sentences]
        test = evaluate_loss(self.dp, params, self.test_split.batches)
        test["bleu"], hypotheses = translate_and_score(
            self.model_config,
            self.dp.local_copies(params),
            self.tokenizer,
            pairs,
            self.config.decode,
        )
        say(describe(step, f"test ({len(pairs)} sentences)", test))
        samples = list(zip(pairs, hypotheses, strict=True))[: self.config.train.samples]
        for (source, reference), hypothesis in samples:
            say(f"  source:      {source}\n  reference:   {reference}\n  translation: {hypothesis}")
        return {f"test_{k}": v for k, v in test.items()}
