"""Host memory for CPU training: keep the pages of freed buffers for the next step.

Every step XLA's CPU runtime allocates its output and temporary buffers (hundreds of MB
for the base model) and frees them when the step ends. glibc serves such large requests
with fresh ``mmap`` pages and unmaps them on free, so each step would fault its whole
working set in again. :func:`retain_freed_memory` makes glibc serve every request from its
one main heap (one arena, no ``mmap``) and never trim it, so later steps reuse mapped
pages (``benchmarks/train_throughput.py --system-malloc`` measures without it). The price:
the process keeps its peak heap size.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt parameters (glibc malloc.h), their environment-variable equivalents and values.
_SETTINGS = (
    (-8, "MALLOC_ARENA_MAX", 1),  # M_ARENA_MAX: every thread allocates from the main heap
    (-4, "MALLOC_MMAP_MAX_", 0),  # M_MMAP_MAX: never mmap a request of its own
    (-1, "MALLOC_TRIM_THRESHOLD_", 2**31 - 1),  # M_TRIM_THRESHOLD: never shrink the heap
)


def retain_freed_memory() -> bool:
    """Set glibc's malloc to reuse freed memory; False (nothing changed) without glibc.

    Call it before the first JAX computation: threads started later (XLA's thread pool)
    allocate from the main heap. Child processes get the same through
    :func:`retaining_environment`.
    """
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl): leave malloc alone
        return False
    return all(mallopt(param, value) == 1 for param, _, value in _SETTINGS)


def retaining_environment() -> dict[str, str]:
    """The environment variables that make a new process's glibc behave the same."""
    return {name: str(value) for _, name, value in _SETTINGS}
