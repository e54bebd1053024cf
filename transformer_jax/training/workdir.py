"""One writer per workdir: an advisory lock that ``train.py`` and ``average`` hold while they
write, released by the OS when the process ends however it ends."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator

LOCK_FILE = "workdir.lock"


def prepare_workdir(workdir: str) -> None:
    """Create ``workdir`` if needed; ValueError if it is a file or cannot be written."""
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ValueError(f"workdir {workdir!r} is a file, not a directory")
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create workdir {workdir!r}: {e.strerror}") from None
    if not os.access(workdir, os.W_OK | os.X_OK):
        raise ValueError(f"workdir {workdir!r} is not writable")


@contextlib.contextmanager
def lock_workdir(workdir: str) -> Iterator[None]:
    """Hold ``{workdir}/workdir.lock`` (creating ``workdir``); ValueError naming the holder's
    pid if another process holds it."""
    prepare_workdir(workdir)
    path = os.path.join(workdir, LOCK_FILE)
    try:
        f = open(path, "a+")  # noqa: SIM115 - held open until the lock is released
    except OSError as e:
        raise ValueError(f"cannot write {path!r}: {e.strerror}") from None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            raise ValueError(
                f"workdir {workdir!r} is in use by another process ({holder}); wait for it to "
                "finish or stop it, or choose another --workdir"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}: {' '.join(sys.argv)[:200]}\n")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
