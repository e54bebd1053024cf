"""Parallel text: (source sentence, target sentence) pairs from TFDS, text files or the
embedded synthetic task, selected by ``config.data.source``.

:func:`stream_pairs` reads a split as it comes (text line by line, TFDS in batches of
records), so that preparing a corpus holds one chunk of it at a time; :func:`load_pairs`
is the same as a list, for the small evaluation splits.
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import urllib.request
import zlib
from collections.abc import Iterable, Iterator
from itertools import zip_longest
from typing import Any

from transformer_jax.data.config import SOURCES, DataConfig
from transformer_jax.data.download import tfds_build
from transformer_jax.data.synthetic import synthetic_pairs

TFDS_READ_BATCH = 1024  # records per batched ArrayRecord read
# Where TFDS downloads a prepared dataset from first: reachable or not within the timeout
# decides whether an unprepared dataset is downloaded or refused at once.
TFDS_DOWNLOADS, TFDS_PROBE_TIMEOUT = "https://storage.googleapis.com", 5.0

Pair = tuple[str, str]
log = logging.getLogger(__name__)


def stream_pairs(data_config: DataConfig, split: str, counts: ReadCounts) -> Iterator[Pair]:
    """The (src_text, tgt_text) pairs of ``split`` from ``data_config.source``, in order.

    Pairs with an empty side are skipped and counted in ``counts`` (with the lines whose
    undecodable bytes were replaced). Every process that reads gets the whole split;
    :mod:`transformer_jax.data.batching` gives each process its own rows.
    """
    source = data_config.source
    if source == "synthetic":
        yield from synthetic_pairs(split)
    elif source == "text":
        src_path = text_path(data_config.text_dir, split, data_config.src_lang)
        tgt_path = text_path(data_config.text_dir, split, data_config.tgt_lang)
        yield from stream_parallel_text(src_path, tgt_path, counts)
    elif source == "tfds":
        yield from stream_tfds(
            data_config.tfds_name,
            split,
            data_config.src_lang,
            data_config.tgt_lang,
            counts,
            data_config.tfds_data_dir or None,
        )
    else:
        raise ValueError(f"data.source must be one of {SOURCES}, got {source!r}")


def count_pairs(data_config: DataConfig, split: str) -> int | None:
    """The number of lines or records of ``split`` (pairs before the empty ones are
    skipped), for a progress bar; None where unknown."""
    if data_config.source == "synthetic":
        return len(synthetic_pairs(split))
    if data_config.source == "text":
        return count_lines(text_path(data_config.text_dir, split, data_config.src_lang)) or None
    if data_config.source == "tfds":
        name, data_dir = data_config.tfds_name, data_config.tfds_data_dir or None
        return len(_tfds_source(name, split, data_dir))
    return None


def load_pairs(data_config: DataConfig, split: str) -> list[Pair]:
    """All pairs of ``split`` (:func:`stream_pairs`) as a list; the skipped ones logged."""
    counts = ReadCounts()
    pairs = list(stream_pairs(data_config, split, counts))
    if counts.skipped_empty:
        log.info("%s: skipped %d pairs with an empty side", split, counts.skipped_empty)
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


class ReadCounts:
    """What reading a split left out or changed: pairs skipped for an empty side, and lines
    whose undecodable bytes became U+FFFD (counted over both files)."""

    def __init__(self) -> None:
        self.skipped_empty = 0
        self.replaced_lines = 0

    def as_dict(self) -> dict[str, int]:
        return {"skipped_empty": self.skipped_empty, "replaced_lines": self.replaced_lines}


def decoded_lines(
    raw_lines: Iterable[bytes], name: str, counts: ReadCounts | None = None
) -> Iterator[str]:
    """The lines of UTF-8 text ``raw_lines`` (as a binary file yields them), a byte-order mark
    dropped and a few undecodable bytes replaced by U+FFFD; ValueError naming ``name`` for
    UTF-16/32, binary (NUL bytes) or text in another encoding (undecodable bytes on over 1%
    of the lines, and over 10, checked when the text ends).

    Lines end only at ``\\n`` (or ``\\r\\n``), not at the other separators
    ``str.splitlines`` knows, so line N of two parallel files stays aligned.
    """
    bad: list[int] = []
    lines = 0
    for n, raw in enumerate(raw_lines):
        lines = n + 1
        if n == 0:
            if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
                raise ValueError(f"{name} is UTF-16 or UTF-32 text; convert it to UTF-8")
            raw = raw.removeprefix(b"\xef\xbb\xbf")
        if b"\x00" in raw:
            raise ValueError(f"{name} holds NUL bytes: it is binary or UTF-16/32, not UTF-8 text")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            line = raw.decode("utf-8", errors="replace")
            bad.append(n)
            if counts is not None:
                counts.replaced_lines += 1
        yield line.removesuffix("\n").removesuffix("\r")
    if len(bad) > max(10, lines // 100):
        raise ValueError(
            f"{name} is not UTF-8: {len(bad)} of its {lines} lines hold undecodable bytes "
            f"(the first is line {bad[0] + 1}); convert it to UTF-8"
        )


def split_lines(data: bytes, name: str) -> list[str]:
    """The lines of UTF-8 text ``data`` (see :func:`decoded_lines`)."""
    return list(decoded_lines(io.BytesIO(data), name))


def stream_lines(path: str, counts: ReadCounts | None = None) -> Iterator[str]:
    """Lines of a UTF-8 (optionally gzip) file, read as they come (see
    :func:`decoded_lines`); ValueError naming the file if it is missing, truncated or
    corrupt, or not UTF-8 text."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            yield from decoded_lines(f, path, counts)
    except FileNotFoundError:
        raise ValueError(f"file {path!r} does not exist") from None
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"cannot read {path}: {e}") from None


def read_lines(path: str) -> list[str]:
    """All lines of a UTF-8 (optionally gzip) file (see :func:`stream_lines`)."""
    return list(stream_lines(path))


def count_lines(path: str) -> int:
    """Line count of a (gzip) text file, for a progress bar's total; 0 if unreadable."""
    opener = gzip.open if path.endswith(".gz") else open
    total, last = 0, b"\n"
    try:
        with opener(path, "rb") as f:
            while block := f.read(1 << 22):
                total, last = total + block.count(b"\n"), block[-1:]
    except (OSError, EOFError, zlib.error):
        return 0
    return total + (last != b"\n")


def stream_parallel_text(src_path: str, tgt_path: str, counts: ReadCounts) -> Iterator[Pair]:
    """Pairs from two line-aligned files, read as they come; ValueError naming both files
    if they differ in length."""
    missing = object()
    sources, targets = stream_lines(src_path, counts), stream_lines(tgt_path, counts)

    def aligned() -> Iterator[Pair]:
        for n, (s, t) in enumerate(zip_longest(sources, targets, fillvalue=missing)):
            if s is missing or t is missing:
                longer = n + 1 + sum(1 for _ in (targets if s is missing else sources))
                src_lines, tgt_lines = (n, longer) if s is missing else (longer, n)
                raise ValueError(
                    f"parallel files differ in length: {src_path} has {src_lines} lines, "
                    f"{tgt_path} has {tgt_lines}"
                )
            yield s, t

    return _non_empty(aligned(), counts)


def _non_empty(pairs: Iterable[Pair], counts: ReadCounts) -> Iterator[Pair]:
    """``pairs`` stripped, those with an empty side left out and counted."""
    for s, t in pairs:
        s, t = s.strip(), t.strip()
        if s and t:
            yield s, t
        else:
            counts.skipped_empty += 1


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if hasattr(value, "item"):  # numpy scalar / 0-d array
        return _text(value.item())
    return str(value)


def _tfds_source(name: str, split: str, data_dir: str | None) -> Any:
    """``tfds.data_source`` of a prepared ArrayRecord dataset (random access, no
    TensorFlow); ValueError naming the field for an unknown dataset, or for an unprepared one
    that cannot be downloaded (at once, with nothing written, when the network is down)."""
    import tensorflow_datasets as tfds

    try:  # registers the translation builders (wmt14_translate, ...) without TensorFlow
        import tensorflow_datasets.translate  # noqa: F401
    except ImportError:
        pass
    absl_log = logging.getLogger("absl")  # TFDS warns of a dataset folder not yet prepared
    absl_log.addFilter(_no_unprepared_folder_warning)
    try:
        builder = tfds.builder(name, data_dir=data_dir or None)
        prepared, folder = builder.is_prepared(), builder.data_dir
    except tfds.core.registered.DatasetNotFoundError as e:
        first_line = str(e).splitlines()[0]
        raise ValueError(f"data.tfds_name={name!r} is not a TFDS dataset: {first_line}") from None
    finally:
        absl_log.removeFilter(_no_unprepared_folder_warning)
    if prepared:
        return tfds.data_source(name, split=split, data_dir=data_dir or None)
    unprepared = (
        f"data.tfds_name={name!r} is not prepared in {folder} "
        f"(data.tfds_data_dir={data_dir or ''!r})"
    )
    hint = (
        f"prepare it on a machine with network access with {tfds_build(name)} and set "
        "data.tfds_data_dir=DIR"
    )
    if reason := _unreachable(TFDS_DOWNLOADS, TFDS_PROBE_TIMEOUT):
        raise ValueError(f"{unprepared} and the network is unreachable ({reason}): {hint}")
    try:
        return tfds.data_source(name, split=split, data_dir=data_dir or None)
    except OSError as e:  # the download failed
        cause = (str(e).splitlines() or [""])[0]
        raise ValueError(f"{unprepared} and the download failed ({cause}): {hint}") from None


def _no_unprepared_folder_warning(record: logging.LogRecord) -> bool:
    return "has no dataset_info.json" not in record.getMessage()


def _unreachable(url: str, timeout: float) -> str | None:
    """Why ``url`` cannot be reached within ``timeout`` seconds (through the proxies of
    the environment, as TFDS's downloads), or None when it answers."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout)
    except urllib.error.HTTPError:  # an answer: the network is up
        return None
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return f"{type(reason).__name__}: {reason}".splitlines()[0]
    return None


def _read_records(data: Any, start: int, stop: int) -> list[Any]:
    """Records ``start:stop`` of a data source in one batched read, or one by one where it
    has none (the sources of ``tfds.testing.mock_data``)."""
    try:
        return list(data.__getitems__(list(range(start, stop))))
    except (AttributeError, TypeError):
        return [data[i] for i in range(start, stop)]


def stream_tfds(
    name: str,
    split: str,
    src_lang: str,
    tgt_lang: str,
    counts: ReadCounts,
    data_dir: str | None = None,
) -> Iterator[Pair]:
    """Pairs of a TFDS translation dataset read by language key (so
    ``wmt14_translate/de-en`` gives en->de as well as de->en), ``TFDS_READ_BATCH``
    records at a time; the dataset must already be prepared in ``data_dir`` as ArrayRecord.
    """
    data = _tfds_source(name, split, data_dir)

    def records() -> Iterator[Pair]:
        for start in range(0, len(data), TFDS_READ_BATCH):
            for record in _read_records(data, start, min(start + TFDS_READ_BATCH, len(data))):
                if src_lang not in record or tgt_lang not in record:
                    raise ValueError(
                        f"data.src_lang={src_lang!r} / data.tgt_lang={tgt_lang!r} must be "
                        f"features of {name}, which has {sorted(record)}"
                    )
                yield _text(record[src_lang]), _text(record[tgt_lang])

    return _non_empty(records(), counts)
