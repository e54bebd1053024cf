"""What a checkpoint's arrays must be to be used: their CRC-32s as saved, finite, and the
shapes the config describes; and the quiet end of the reads a failed restore leaves pending.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import time
import zlib
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np


def checksums(tree: Any) -> dict[str, int]:
    """CRC-32 of the bytes of each array of a host pytree, by its path."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        jax.tree_util.keystr(path): zlib.crc32(np.ascontiguousarray(leaf).view(np.uint8))
        for path, leaf in leaves
    }


def non_finite(tree: Any) -> list[str]:
    """Paths of the floating-point arrays of a host pytree holding a NaN or infinity."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [
        jax.tree_util.keystr(path)
        for path, leaf in leaves
        if np.issubdtype(np.asarray(leaf).dtype, np.inexact) and not np.isfinite(leaf).all()
    ]


def shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): tuple(leaf.shape) for path, leaf in leaves}


def difference(saved: dict[str, tuple], expected: dict[str, tuple]) -> str:
    """The first few arrays that are missing, unexpected or differently shaped."""
    missing = [k for k in expected if k not in saved]
    extra = [k for k in saved if k not in expected]
    shaped = [
        f"{k} {saved[k]} != {expected[k]}"
        for k in expected
        if saved.get(k, expected[k]) != expected[k]
    ]
    parts = [
        f"{name}: {', '.join(items[:3])}{' ...' if len(items) > 3 else ''}"
        for name, items in (("missing", missing), ("unexpected", extra), ("shape", shaped))
        if items
    ]
    return "; ".join(parts)


class _AbandonedReads(logging.Filter):
    """Silences the reads orbax leaves pending when restoring a checkpoint fails, while
    :func:`abandoned_reads` is entered.

    Orbax closes its event loop on the first read error; asyncio then logs each other
    read's error ("... exception was never retrieved") when it is collected, and a read
    ending after the close raises "Event loop is closed" into ``sys.unraisablehook``, which
    can happen while ``restore`` is still raising. For the checkpoint at ``path``, a failed
    one's warning line says what happened, and both are dropped; every other record and
    unraisable error passes on unchanged.
    """

    def __init__(self, path: str, unraisablehook: Any) -> None:
        super().__init__()
        self.path = os.path.join(os.path.abspath(path), "")
        self.unraisablehook = unraisablehook
        self.last_dropped = time.monotonic()

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or self.path not in str(error)

    def unraisable(self, unraisable: Any) -> None:
        closed = unraisable.exc_type is RuntimeError and (
            str(unraisable.exc_value) == "Event loop is closed"
        )
        if closed:
            self.last_dropped = time.monotonic()
        else:
            self.unraisablehook(unraisable)

    def settle(self, quiet: float = 0.5, limit: float = 5.0) -> None:
        """Wait (at most ``limit`` s) until the pending reads have ended: ``quiet`` s without
        another one dropped, their tasks collected."""
        end = time.monotonic() + limit
        while time.monotonic() < end:
            gc.collect()
            if time.monotonic() - self.last_dropped >= quiet:
                return
            time.sleep(0.05)


@contextlib.contextmanager
def abandoned_reads(path: str) -> Iterator[None]:
    """Drop the errors of the reads a failed restore of ``path`` leaves pending (see above)
    while the block runs and its leftovers are collected; ``sys.unraisablehook`` and the
    asyncio logger's filters are as they were after it."""
    reads = _AbandonedReads(path, sys.unraisablehook)
    logger = logging.getLogger("asyncio")
    logger.addFilter(reads)
    sys.unraisablehook = reads.unraisable
    try:
        yield
    except BaseException:
        reads.settle()  # a failed restore's reads end, and are collected, while dropped
        raise
    finally:
        gc.collect()
        sys.unraisablehook = reads.unraisablehook
        logger.removeFilter(reads)


def verify(saved: dict[str, dict[str, int]], restored: dict[str, Any]) -> None:
    """ValueError naming the first array of ``restored`` (``{item: pytree}``) whose CRC-32
    differs from the one ``saved`` at save time (``{item: {path: crc}}``)."""
    for name, tree in restored.items():
        for key, value in checksums(tree).items():
            if saved[name].get(key) != value:
                raise ValueError(f"checksum mismatch in {name}{key}")
