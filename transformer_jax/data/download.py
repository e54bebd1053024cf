"""Multi30k (Elliott et al., 2016), task 1: English, German and French image captions,
laid out as the ``text`` source reads them (``{dest}/{split}.{lang}``, line N of each
language a translation of line N of the others).

The files are the public Multi30k repository's ``data/task1/raw/{split}.{lang}.gz``,
decompressed and checked against their known line counts. Each file is written under a
temporary name and renamed into place when complete, so an interrupted download leaves no
partial file; files already present with the right line count are kept.

WMT14 English-German, the paper's data (``configs/base.py``, ``big.py``), is TFDS's
``wmt14_translate/de-en``, read from ``data.tfds_data_dir`` in ArrayRecord format (see
``WMT14``).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import urllib.error
import urllib.request
from collections.abc import Sequence

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
MULTI30K_SPLITS = {"train": 29_000, "val": 1_014, "test_2016_flickr": 1_000}  # lines each
MULTI30K_LANGS = ("en", "de", "fr")


def tfds_build(name: str) -> str:
    """The command that prepares TFDS dataset ``name`` as ``data.tfds_data_dir=DIR`` reads it."""
    return (
        f"`tfds build {name} --file_format=array_record --data_dir DIR` (the tfds command "
        "needs `pip install tensorflow`)"
    )


WMT14 = (
    "WMT14 English-German is TFDS's wmt14_translate/de-en: prepare it on a machine with network "
    f"access with {tfds_build('wmt14_translate/de-en')}, then train with "
    "--config.data.tfds_data_dir=DIR"
)
TIMEOUT_S = 60


def download_multi30k(
    dest: str, base_url: str = MULTI30K_URL, langs: Sequence[str] = MULTI30K_LANGS
) -> list[str]:
    """Write ``{dest}/{split}.{lang}`` for every split of ``MULTI30K_SPLITS`` and each of
    ``langs`` from ``{base_url}/{split}.{lang}.gz`` (any URL ``urllib`` opens, ``file://``
    included). Returns the paths written (those already complete are skipped). ValueError
    naming the URL or file for an unknown language, a failed download, a file that is not
    gzip or has the wrong number of lines."""
    unknown = sorted(set(langs) - set(MULTI30K_LANGS))
    if unknown:
        raise ValueError(f"Multi30k has no language {unknown}; it has {list(MULTI30K_LANGS)}")
    created = _missing_folders(dest)
    os.makedirs(dest, exist_ok=True)
    written = []
    try:
        for split, lines in MULTI30K_SPLITS.items():
            for lang in langs:
                path = os.path.join(dest, f"{split}.{lang}")
                if _line_count(path) == lines:
                    continue
                url = f"{base_url.rstrip('/')}/{split}.{lang}.gz"
                data = _fetch(url)
                if (found := data.count(b"\n")) != lines:
                    raise ValueError(f"{url} has {found} lines, not {lines}")
                _write_atomically(path, data)
                written.append(path)
    except (ValueError, OSError):
        for folder in created:  # the folders made here, if still empty, deepest first
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        raise
    return written


def _missing_folders(dest: str) -> list[str]:
    """The folders ``os.makedirs(dest)`` would create, deepest first."""
    missing, folder = [], os.path.abspath(dest)
    while not os.path.exists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    return missing


def _fetch(url: str) -> bytes:
    """The decompressed bytes of the gzip file at ``url``; ValueError naming it on failure."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            compressed = response.read()
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise ValueError(
            f"could not download {url}: {reason}; without network here, copy the "
            "{split}.{lang}.gz files of github.com/multi30k/dataset's data/task1/raw (from a "
            "machine with network) to a folder F and rerun with --base_url=file:///F"
        ) from None
    try:
        return gzip.decompress(compressed)
    except (OSError, EOFError) as e:
        raise ValueError(f"{url} is not a complete gzip file ({e})") from None


def _line_count(path: str) -> int | None:
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return f.read().count(b"\n")


def _write_atomically(path: str, data: bytes) -> None:
    partial = f"{path}.partial"
    try:
        with open(partial, "wb") as f:
            f.write(data)
        os.replace(partial, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise
