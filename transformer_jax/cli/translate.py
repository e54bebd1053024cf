"""Translate text with a trained run (paper §6.1 decoding: beam 4, alpha 0.6, input + 50).

    transformer-jax translate --workdir DIR [--beam_size 4] [--alpha 0.6]
        [--checkpoint latest|STEP|averaged|snapshots/STEP] [--input FILE]
        < source.txt > translations.txt

One source sentence per line in, one translation per line out, in the same order; an
empty line gives an empty line. Sentences are sorted by length and decoded in batches
whose shapes come from a few buckets, so each shape compiles once, spread over every local
device (a copy of the parameters on each). ``--workdir`` given
more than once translates with the runs as an ensemble (the mean of their next-token
probabilities; one shared tokenizer).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from absl import flags

from transformer_jax.cli.common import define_decode_flags, read_lines, translate
from transformer_jax.cli.flags import no_arguments, run


def define_flags(values: flags.FlagValues, argv: list[str]) -> None:
    define_decode_flags(values)
    flags.DEFINE_string(
        "input", None, "Source sentences, one per line (default: stdin).", flag_values=values
    )


def _translate(values: flags.FlagValues, positional: list[str]) -> None:
    no_arguments(positional)
    _, _, translations = translate(values, read_lines(values.input))
    sys.stdout.buffer.write("".join(t + "\n" for t in translations).encode("utf-8"))
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """``transformer-jax translate``: translate with the command line ``argv``; the exit code."""
    return run(__doc__, define_flags, _translate, argv, "transformer-jax translate")


if __name__ == "__main__":
    sys.exit(main())
