"""Translate a test set and score it with BLEU (paper §6.1, Table 2).

    transformer-jax evaluate --workdir DIR --src FILE --ref FILE
        [--beam_size 4] [--alpha 0.6] [--checkpoint latest|STEP|averaged|snapshots/STEP]
        [--out FILE]

Prints two numbers:

- sacreBLEU on detokenized text with its signature: the comparable number (Post 2018);
- tokenized BLEU in the paper's style, as tensor2tensor's ``get_ende_bleu.sh``: Moses
  unicode-punctuation replacement and tokenization of hypotheses and references, German
  compounds split at intra-word hyphens (``rich-text`` -> ``rich ##AT##-##AT## text``),
  then multi-bleu (case-sensitive, unsmoothed). It is the kind of number the paper
  reports (28.4 / 27.3 on newstest2014 en-de), not comparable across tokenizations.

``--workdir`` given more than once decodes the runs as an ensemble: the mean of their
next-token probabilities (the runs share one tokenizer; ``--checkpoint`` names the same
checkpoint in each).

The hypotheses are written to ``--out`` (default ``{src}.hyp``), the scores next to them
(``{out}.bleu``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from absl import flags

from transformer_jax.cli.common import define_decode_flags, read_lines, translate
from transformer_jax.cli.flags import no_arguments, run


def define_flags(values: flags.FlagValues, argv: list[str]) -> None:
    define_decode_flags(values)
    define = {"flag_values": values}
    flags.DEFINE_string("src", None, "Source sentences, one per line.", **define)
    flags.DEFINE_string("ref", None, "Reference translations, one per line.", **define)
    flags.DEFINE_string("out", None, "The hypotheses' file (default: {src}.hyp).", **define)
    flags.mark_flags_as_required(["src", "ref"], flag_values=values)


def report(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> str:
    """The two BLEU lines printed by the command."""
    from transformer_jax.inference.bleu import bleu, tokenized_bleu

    detok = bleu(hypotheses, references)
    tok = tokenized_bleu(hypotheses, references, lang)
    style = "Moses-tokenized" + (", compounds split" if lang == "de" else "")
    return (
        f"sacreBLEU (detokenized, comparable) = {detok.score:.2f}  {detok.signature}\n"
        f"  {detok}\n"
        f"tokenized BLEU (paper style: {style}, multi-bleu) = {tok.score:.2f}\n"
        f"  {tok}\n"
    )


def _evaluate(values: flags.FlagValues, positional: list[str]) -> None:
    from transformer_jax.inference.bleu import check_pairs

    no_arguments(positional)
    out = values.out or f"{values.src}.hyp"
    sources, references = read_lines(values.src), read_lines(values.ref)
    check_pairs(sources, references)
    if not sources:
        raise ValueError(f"{values.src} is empty: there is nothing to evaluate")
    run_config, options, hypotheses = translate(values, sources)
    lang = run_config.data.tgt_lang
    scores = report(hypotheses, references, lang)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.writelines(h + "\n" for h in hypotheses)
    models = len(values.workdir)
    with open(f"{out}.bleu", "w", encoding="utf-8") as f:
        ensemble = f"ensemble of {models} runs, " if models > 1 else ""
        f.write(f"{values.src} ({len(sources)} sentences), {ensemble}")
        f.write(f"checkpoint {values.checkpoint}, ")
        f.write(f"beam {options['beam_size']}, alpha {options['alpha']}\n{scores}")
    print(scores, end="")
    print(f"hypotheses: {out}; scores: {out}.bleu")


def main(argv: Sequence[str] | None = None) -> int:
    """``transformer-jax evaluate``: evaluate with the command line ``argv``; the exit code."""
    return run(__doc__, define_flags, _evaluate, argv, "transformer-jax evaluate")


if __name__ == "__main__":
    sys.exit(main())
