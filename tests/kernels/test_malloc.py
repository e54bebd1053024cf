"""glibc malloc settings for CPU training (``transformer_jax.kernels.malloc``)."""

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT as REPO_ROOT

from transformer_jax.kernels.malloc import retaining_environment

ROOT = str(REPO_ROOT)

# A child process allocates and frees a 64 MB array and reports glibc's own accounting:
# bytes in mmapped blocks while it lives, heap (arena) bytes after it is freed.
PROBE = textwrap.dedent(
    """
    import ctypes, sys
    import numpy as np
    from transformer_jax.kernels.malloc import retain_freed_memory

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    if sys.argv[1] == "call":
        assert retain_freed_memory()
    buffer = np.ones(64 << 18, np.float32)
    mmapped = libc.mallinfo2().hblkhd
    del buffer
    print(mmapped, libc.mallinfo2().arena)
    """
)


def _probe(how: str, env: dict[str, str]) -> tuple[int, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, how],
        env=dict(os.environ, PYTHONPATH=ROOT, **env),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    mmapped, heap = (int(v) for v in out.split())
    return mmapped, heap


def _has_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not _has_mallinfo2(), reason="needs glibc >= 2.33")
def test_large_buffers_come_from_the_heap_and_stay_there():
    mb64 = 64 << 20
    mmapped, _ = _probe("none", {})
    assert mmapped >= mb64  # glibc's default: a fresh mapping, unmapped on free
    for how, env in (("call", {}), ("none", retaining_environment())):
        mmapped, heap = _probe(how, env)
        assert mmapped < mb64, how  # served from the heap ...
        assert heap >= mb64, how  # ... which keeps the freed pages for the next step
