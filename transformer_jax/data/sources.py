"""Parallel text: (source sentence, target sentence) pairs from TFDS, text files or the
embedded synthetic task, selected by ``config.data.source``.
"""

from __future__ import annotations

import gzip
import logging
import os
from typing import Any

from transformer_jax.data.synthetic import synthetic_pairs

SOURCES = ("tfds", "text", "synthetic")

Pair = tuple[str, str]
log = logging.getLogger(__name__)


def load_pairs(data_config: Any, split: str) -> list[Pair]:
    """All (src_text, tgt_text) pairs of ``split`` from ``data_config.source``.

    Pairs with an empty side are skipped (and counted in the log). Every process loads the
    whole split; :mod:`transformer_jax.data.batching` gives each process its own rows.
    """
    source = data_config.source
    if source == "synthetic":
        return synthetic_pairs(split)
    if source == "text":
        src_path = text_path(data_config.text_dir, split, data_config.src_lang)
        tgt_path = text_path(data_config.text_dir, split, data_config.tgt_lang)
        pairs, skipped = read_parallel_text(src_path, tgt_path)
    elif source == "tfds":
        pairs, skipped = read_tfds(
            data_config.tfds_name,
            split,
            data_config.src_lang,
            data_config.tgt_lang,
            data_config.get("tfds_data_dir") or None,
        )
    else:
        raise ValueError(f"data.source must be one of {SOURCES}, got {source!r}")
    if skipped:
        log.info("%s/%s: skipped %d pairs with an empty side", source, split, skipped)
    return pairs


def text_path(text_dir: str, split: str, lang: str) -> str:
    """``{text_dir}/{split}.{lang}``, or the same with ``.gz``."""
    if not text_dir:
        raise ValueError("data.text_dir must be set for data.source='text'")
    path = os.path.join(text_dir, f"{split}.{lang}")
    for candidate in (path, path + ".gz"):
        if os.path.isfile(candidate):
            return candidate
    raise ValueError(
        f"missing text file {path!r} (or {path}.gz): check data.text_dir, the split name "
        f"{split!r} and data.src_lang / data.tgt_lang"
    )


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def split_lines(data: bytes, name: str) -> list[str]:
    """The lines of UTF-8 text ``data``, a byte-order mark dropped and a few undecodable
    bytes replaced by U+FFFD; ValueError naming ``name`` for UTF-16/32, binary (NUL bytes)
    or text in another encoding (undecodable bytes on over 1% of the lines, and over 10).

    Lines end only at ``\\n`` (or ``\\r\\n``), not at the other separators
    ``str.splitlines`` knows, so line N of two parallel files stays aligned.
    """
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ValueError(f"{name} is UTF-16 or UTF-32 text; convert it to UTF-8")
    if b"\x00" in data:
        raise ValueError(f"{name} holds NUL bytes: it is binary or UTF-16/32, not UTF-8 text")
    try:
        text, bad = data.decode("utf-8"), []
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        bad = [i for i, raw in enumerate(data.split(b"\n")) if not _is_utf8(raw)]
    lines = text.removeprefix("\ufeff").split("\n")
    if lines[-1] == "":
        lines.pop()
    if len(bad) > max(10, len(lines) // 100):
        raise ValueError(
            f"{name} is not UTF-8: {len(bad)} of its {len(lines)} lines hold undecodable bytes "
            f"(the first is line {bad[0] + 1}); convert it to UTF-8"
        )
    return [line.removesuffix("\r") for line in lines]


def read_lines(path: str) -> list[str]:
    """Lines of a UTF-8 (optionally gzip) file (see :func:`split_lines`); ValueError naming
    the file if it is missing, truncated or not UTF-8 text."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ValueError(f"file {path!r} does not exist") from None
    except (OSError, EOFError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    return split_lines(data, path)


def _clean_pairs(sources: list[str], targets: list[str]) -> tuple[list[Pair], int]:
    pairs = [(s.strip(), t.strip()) for s, t in zip(sources, targets, strict=True)]
    kept = [(s, t) for s, t in pairs if s and t]
    return kept, len(pairs) - len(kept)


def read_parallel_text(src_path: str, tgt_path: str) -> tuple[list[Pair], int]:
    """Pairs from two line-aligned files and the number of pairs skipped as empty."""
    sources, targets = read_lines(src_path), read_lines(tgt_path)
    if len(sources) != len(targets):
        raise ValueError(
            f"parallel files differ in length: {src_path} has {len(sources)} lines, "
            f"{tgt_path} has {len(targets)}"
        )
    return _clean_pairs(sources, targets)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if hasattr(value, "item"):  # numpy scalar / 0-d array
        return _text(value.item())
    return str(value)


def read_tfds(
    name: str, split: str, src_lang: str, tgt_lang: str, data_dir: str | None = None
) -> tuple[list[Pair], int]:
    """Pairs of a TFDS translation dataset, read by language key (so ``wmt14_translate/de-en``
    gives en->de as well as de->en).

    Uses ``tfds.data_source`` (random access to ArrayRecord files), which needs no
    TensorFlow; the dataset must already be prepared in ``data_dir`` in that format.
    """
    import tensorflow_datasets as tfds

    try:  # registers the translation builders (wmt14_translate, ...) without TensorFlow
        import tensorflow_datasets.translate  # noqa: F401
    except ImportError:
        pass
    try:
        data = tfds.data_source(name, split=split, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as e:
        first_line = str(e).splitlines()[0]
        raise ValueError(f"data.tfds_name={name!r} is not a TFDS dataset: {first_line}") from None
    except OSError as e:  # not prepared in data_dir, and the download failed
        raise ValueError(
            f"data.tfds_name={name!r} is not prepared in data.tfds_data_dir={data_dir or ''!r} "
            f"and could not be downloaded ({type(e).__name__}: {str(e)[:200]}); prepare it on "
            f"a machine with network access (`tfds build {name} --file_format=array_record "
            "--data_dir DIR`) and set data.tfds_data_dir=DIR"
        ) from None
    sources: list[str] = []
    targets: list[str] = []
    for i in range(len(data)):
        record = data[i]
        if src_lang not in record or tgt_lang not in record:
            raise ValueError(
                f"data.src_lang={src_lang!r} / data.tgt_lang={tgt_lang!r} must be features "
                f"of {name}, which has {sorted(record)}"
            )
        sources.append(_text(record[src_lang]))
        targets.append(_text(record[tgt_lang]))
    return _clean_pairs(sources, targets)
