"""Translate text with a trained run (paper §6.1 decoding: beam 4, alpha 0.6, input + 50).

    python -m transformer_jax.translate --workdir DIR [--beam_size 4] [--alpha 0.6]
        [--checkpoint latest|STEP|averaged|snapshots/STEP] [--input FILE]
        < source.txt > translations.txt

One source sentence per line in, one translation per line out, in the same order; an
empty line gives an empty line. Sentences are sorted by length and decoded in batches
whose shapes come from a few buckets, so each shape compiles once. ``--workdir`` given
more than once translates with the runs as an ensemble (the mean of their next-token
probabilities; one shared tokenizer).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from transformer_jax.cli.common import add_decode_flags, decode_options, load_models, read_lines
from transformer_jax.inference.translation import translate_lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_jax.translate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_decode_flags(parser)
    parser.add_argument("--input", help="source sentences, one per line (default: stdin)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        lines = read_lines(args.input)
        run, config, params, tokenizer = load_models(args.workdir, args.checkpoint)
        translations = translate_lines(
            config, params, tokenizer, lines, **decode_options(args, run)
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stdout.buffer.write("".join(t + "\n" for t in translations).encode("utf-8"))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
