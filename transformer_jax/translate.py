"""Translate text with a trained run (paper §6.1 decoding: beam 4, alpha 0.6, input + 50).

    python -m transformer_jax.translate --workdir DIR [--beam_size 4] [--alpha 0.6]
        [--checkpoint latest|STEP|averaged|snapshots/STEP] [--input FILE]
        < source.txt > translations.txt

One source sentence per line in, one translation per line out, in the same order; an
empty line gives an empty line. Sentences are sorted by length and decoded in batches
whose shapes come from a few buckets, so each shape compiles once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from transformer_jax.config import TransformerConfig, from_config_dict
from transformer_jax.data.tokenizer import EOS_ID, PAD_ID, Tokenizer, load_tokenizer
from transformer_jax.decoding import beam_search, greedy_search

log = logging.getLogger(__name__)

MIN_BUCKET = 8  # source lengths are padded to a power of two >= 8 (or to max_src_len)


def translate_lines(
    config: TransformerConfig,
    params: Any,
    tokenizer: Tokenizer,
    lines: Sequence[str],
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_extra_len: int = 50,
    max_src_len: int | None = None,
    batch_size: int = 64,
) -> list[str]:
    """Translations of ``lines`` (one sentence each), in order.

    ``beam_size=1`` is greedy search. Sources longer than ``max_src_len`` tokens (EOS
    included; default ``config.max_len``) are truncated, with a warning. Each sentence
    may produce up to its length + ``max_extra_len`` tokens (capped by ``config.max_len``).
    """
    max_src_len = config.max_len if max_src_len is None else max_src_len
    if not isinstance(max_src_len, int) or not 1 <= max_src_len <= config.max_len:
        raise ValueError(
            f"max_src_len must be an integer in [1, config.max_len={config.max_len}], "
            f"got {max_src_len!r}"
        )
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, got {beam_size!r}")
    if tokenizer.vocab_size > config.tgt_vocab:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} pieces but the model's vocabulary "
            f"(model.vocab_size) is {config.tgt_vocab}"
        )

    todo = [i for i, line in enumerate(lines) if line.strip()]
    ids = tokenizer.encode_batch([lines[i] for i in todo])
    sources = [x[: max_src_len - 1] + [EOS_ID] for x in ids]
    truncated = sum(len(x) + 1 > max_src_len for x in ids)
    if truncated:
        log.warning(
            "%d of %d sentences are longer than %d tokens and were truncated",
            truncated,
            len(todo),
            max_src_len,
        )

    out = [""] * len(lines)
    order = sorted(range(len(sources)), key=lambda j: -len(sources[j]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        src = _pad_batch([sources[j] for j in chunk], max_src_len)
        if beam_size == 1:
            tokens = greedy_search(config, params, src, max_extra_len=max_extra_len)
        else:
            tokens = beam_search(
                config, params, src, beam_size=beam_size, alpha=alpha, max_extra_len=max_extra_len
            )
        for j, row in zip(chunk, np.asarray(tokens), strict=False):
            out[todo[j]] = tokenizer.decode(row.tolist())
    return out


def _pad_batch(sources: list[list[int]], max_src_len: int) -> np.ndarray:
    """Bucketed ``[rows, length]`` PAD-padded batch; rows up to a power of two repeat the
    last sentence (their outputs are dropped), so few shapes ever compile."""
    longest = max(len(x) for x in sources)
    length = min(max(MIN_BUCKET, 1 << (longest - 1).bit_length()), max_src_len)
    rows = 1 << (len(sources) - 1).bit_length()
    batch = np.full((rows, length), PAD_ID, np.int32)
    for r in range(rows):
        x = sources[min(r, len(sources) - 1)]
        batch[r, : len(x)] = x
    return batch


def load(workdir: str, checkpoint: str) -> tuple[Any, TransformerConfig, Any, Tokenizer]:
    """``(run config, model config, params, tokenizer)`` of a workdir; ValueError if absent.

    ``checkpoint`` is ``'latest'``, ``'averaged'``, a step number (as text) or
    ``'snapshots/STEP'``.
    """
    from transformer_jax.training.checkpoints import load_run, parse_checkpoint

    if not os.path.isdir(workdir):
        raise ValueError(f"workdir {workdir!r} does not exist")
    parse_checkpoint(checkpoint)  # a bad name fails before anything is read
    tokenizer = load_tokenizer(os.path.join(workdir, "tokenizer.model"))
    run, params, step = load_run(workdir, checkpoint)
    log.info("loaded %s checkpoint (step %d) from %s", checkpoint, step, workdir)
    return run, from_config_dict(run.model), params, tokenizer


def add_decode_flags(parser: argparse.ArgumentParser) -> None:
    """Flags shared with ``transformer_jax.evaluate``; unset ones come from config.decode."""
    parser.add_argument("--workdir", required=True, help="training run directory")
    parser.add_argument(
        "--checkpoint",
        default="latest",
        help="'latest' (default), 'averaged', a step, or 'snapshots/STEP' (saved on SIGUSR1)",
    )
    parser.add_argument("--beam_size", type=int, help="default: config.decode.beam_size (4)")
    parser.add_argument("--alpha", type=float, help="length penalty; default: config (0.6)")
    parser.add_argument("--max_extra_len", type=int, help="output <= input + this (default 50)")
    parser.add_argument("--max_src_len", type=int, help="truncate longer sources (tokens)")
    parser.add_argument("--batch_size", type=int, default=64, help="sentences per batch")


def decode_options(args: argparse.Namespace, run: Any) -> dict[str, Any]:
    """translate_lines keyword arguments: the flags, else the run's config.decode."""
    decode = run.get("decode", {})
    pick = lambda flag, key, default: (  # noqa: E731
        getattr(args, flag) if getattr(args, flag) is not None else decode.get(key, default)
    )
    return {
        "beam_size": pick("beam_size", "beam_size", 4),
        "alpha": pick("alpha", "alpha", 0.6),
        "max_extra_len": pick("max_extra_len", "max_extra_len", 50),
        "max_src_len": args.max_src_len,
        "batch_size": args.batch_size,
    }


def read_lines(path: str | None) -> list[str]:
    """Lines of ``path`` (UTF-8), or of stdin when ``path`` is None.

    Only ``\n`` (or ``\r\n``) ends a line: unlike ``str.splitlines``, characters such as
    U+2028 inside a sentence do not split it, so outputs stay aligned with inputs.
    """
    if path is None:
        data = sys.stdin.buffer.read()
    elif not os.path.isfile(path):
        raise ValueError(f"input file {path!r} does not exist")
    else:
        with open(path, "rb") as f:
            data = f.read()
    lines = data.decode("utf-8").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_jax.translate", description=__doc__
    )
    add_decode_flags(parser)
    parser.add_argument("--input", help="source sentences, one per line (default: stdin)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        lines = read_lines(args.input)
        run, config, params, tokenizer = load(args.workdir, args.checkpoint)
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
