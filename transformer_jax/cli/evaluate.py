"""Translate a test set and score it with BLEU (paper §6.1, Table 2).

    python -m transformer_jax.evaluate --workdir DIR --src FILE --ref FILE
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

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from transformer_jax.cli.common import add_decode_flags, decode_options, load_models, read_lines
from transformer_jax.inference.bleu import bleu, check_pairs, tokenized_bleu
from transformer_jax.inference.translation import translate_lines


def report(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> str:
    """The two BLEU lines printed by the command."""
    detok = bleu(hypotheses, references)
    tok = tokenized_bleu(hypotheses, references, lang)
    style = "Moses-tokenized" + (", compounds split" if lang == "de" else "")
    return (
        f"sacreBLEU (detokenized, comparable) = {detok.score:.2f}  {detok.signature}\n"
        f"  {detok}\n"
        f"tokenized BLEU (paper style: {style}, multi-bleu) = {tok.score:.2f}\n"
        f"  {tok}\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_jax.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_decode_flags(parser)
    parser.add_argument("--src", required=True, help="source sentences, one per line")
    parser.add_argument("--ref", required=True, help="reference translations, one per line")
    parser.add_argument("--out", help="where to write the hypotheses (default: {src}.hyp)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    out = args.out or f"{args.src}.hyp"
    try:
        sources, references = read_lines(args.src), read_lines(args.ref)
        check_pairs(sources, references)
        if not sources:
            raise ValueError(f"{args.src} is empty: there is nothing to evaluate")
        run, config, params, tokenizer = load_models(args.workdir, args.checkpoint)
        options = decode_options(args, run)
        hypotheses = translate_lines(config, params, tokenizer, sources, **options)
        lang = run.get("data", {}).get("tgt_lang", "de")
        scores = report(hypotheses, references, lang)
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in hypotheses)
        with open(f"{out}.bleu", "w", encoding="utf-8") as f:
            models = f"ensemble of {len(args.workdir)} runs, " if len(args.workdir) > 1 else ""
            f.write(
                f"{args.src} ({len(sources)} sentences), {models}checkpoint {args.checkpoint}, "
            )
            f.write(f"beam {options['beam_size']}, alpha {options['alpha']}\n{scores}")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(scores, end="")
    print(f"hypotheses: {out}; scores: {out}.bleu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
