"""Translation of lines of text with a trained model (paper §6.1: beam 4, alpha 0.6, input + 50).

Sentences are sorted by length and decoded in batches whose shapes come from a few
buckets, so each shape compiles once (per device), over every local device and process.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from transformer_jax.data.tokenizer import EOS_ID, PAD_ID, Tokenizer
from transformer_jax.inference.config import PAPER
from transformer_jax.inference.decoding import beam_search, greedy_search
from transformer_jax.model.config import TransformerConfig
from transformer_jax.multihost.distributed import sum_over_processes

log = logging.getLogger(__name__)

MIN_BUCKET = 8  # source lengths are padded to a power of two >= 8 (or to max_src_len)


@dataclasses.dataclass(frozen=True)
class SourceBatches:
    """The non-empty lines as decoding batches: ``batches[i]``'s first ``len(rows[i])`` rows
    are the lines ``rows[i]`` (indices into the lines), longest first."""

    rows: list[np.ndarray]
    batches: list[np.ndarray]


def translate_lines(
    config: TransformerConfig | Sequence[TransformerConfig],
    params: Any,
    tokenizer: Tokenizer,
    lines: Sequence[str],
    *,
    beam_size: int = PAPER.beam_size,
    alpha: float = PAPER.alpha,
    max_extra_len: int = PAPER.max_extra_len,
    max_src_len: int | None = None,
    batch_size: int = 64,
    devices: Sequence[jax.Device] | None = None,
) -> list[str]:
    """Translations of ``lines`` (one sentence each), in order, decoded over ``devices``
    (default: every local device), a copy of ``params`` on each (:func:`translate_on_devices`).

    ``config, params``: one model, or an ensemble (a list of parameter trees, with one config
    or a list of them; :mod:`transformer_jax.inference.decoding`). ``beam_size=1`` is greedy
    search. Sources longer than ``max_src_len`` tokens (EOS included; default
    ``config.max_len``) are truncated, with a warning. Each sentence may produce up to its
    length + ``max_extra_len`` tokens (capped by ``config.max_len``).
    """
    devices = jax.local_devices() if devices is None else devices
    copies = [jax.device_put(params, device) for device in devices]
    options = dict(beam_size=beam_size, alpha=alpha, max_extra_len=max_extra_len)
    return translate_on_devices(
        config, copies, tokenizer, lines, max_src_len=max_src_len, batch_size=batch_size, **options
    )


def translate_on_devices(
    config: TransformerConfig | Sequence[TransformerConfig],
    device_params: Sequence[Any],
    tokenizer: Tokenizer,
    lines: Sequence[str],
    *,
    beam_size: int,
    alpha: float,
    max_extra_len: int,
    max_src_len: int | None = None,
    batch_size: int = 64,
) -> list[str]:
    """:func:`translate_lines` with one copy of the parameters per local device
    (``device_params``, each on its device). The batches of :func:`source_batches`
    (longest first) are spread over the processes (batch ``b`` on process
    ``b % process_count``) and each process's batches over its devices in turn, all
    dispatched before any is read. With several processes every one calls it and gets
    every translation (a collective)."""
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, got {beam_size!r}")
    sources = source_batches(config, tokenizer, lines, max_src_len, batch_size)
    process, processes = jax.process_index(), jax.process_count()
    mine = range(process, len(sources.batches), processes)
    dispatched = [
        decode_batch(
            config,
            device_params[k % len(device_params)],
            sources.batches[b],
            beam_size,
            alpha,
            max_extra_len,
        )
        for k, b in enumerate(mine)
    ]
    first = config if isinstance(config, TransformerConfig) else config[0]
    tokens = np.zeros((len(lines), first.max_len), np.int32)  # 0: PAD, decoded as ''
    for b, out in zip(mine, dispatched, strict=True):
        rows = sources.rows[b]
        out = np.asarray(out)[: len(rows)]
        tokens[rows, : out.shape[1]] = out
    if processes > 1:  # each row is decoded by one process, zeros elsewhere
        summed = sum_over_processes(tokens.ravel())()
        tokens = np.asarray(summed, np.int32).reshape(tokens.shape)
    return [tokenizer.decode(row.tolist()) for row in tokens]


def source_batches(
    config: TransformerConfig | Sequence[TransformerConfig],
    tokenizer: Tokenizer,
    lines: Sequence[str],
    max_src_len: int | None = None,
    batch_size: int = 64,
) -> SourceBatches:
    """The batches :func:`translate_lines` decodes (its arguments, checked the same way)."""
    first = config if isinstance(config, TransformerConfig) else config[0]
    max_src_len = first.max_len if max_src_len is None else max_src_len
    if not isinstance(max_src_len, int) or not 1 <= max_src_len <= first.max_len:
        raise ValueError(
            f"max_src_len must be an integer in [1, config.max_len={first.max_len}], "
            f"got {max_src_len!r}"
        )
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if tokenizer.vocab_size > first.src_vocab:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} pieces but the model's vocabulary "
            f"(model.vocab_size) is {first.src_vocab}"
        )

    todo = np.array([i for i, line in enumerate(lines) if line.strip()], np.int64)
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

    order = sorted(range(len(sources)), key=lambda j: -len(sources[j]))
    chunks = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    return SourceBatches(
        rows=[todo[chunk] for chunk in chunks],
        batches=[_pad_batch([sources[j] for j in chunk], max_src_len) for chunk in chunks],
    )


def decode_batch(
    config: TransformerConfig | Sequence[TransformerConfig],
    params: Any,
    src: np.ndarray,
    beam_size: int,
    alpha: float,
    max_extra_len: int,
) -> Any:
    """The output ids of one batch of :func:`source_batches`, on the device holding
    ``params`` (a device array, not waited for)."""
    if beam_size == 1:
        return greedy_search(config, params, src, max_extra_len=max_extra_len)
    return beam_search(
        config, params, src, beam_size=beam_size, alpha=alpha, max_extra_len=max_extra_len
    )


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
