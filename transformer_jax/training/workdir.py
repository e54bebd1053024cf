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
    pid if another process holds it. A workdir left holding nothing but the lock (a run
    refused before it wrote anything) is removed again: the lock, and the folder if made here."""
    made = not os.path.exists(workdir)
    prepare_workdir(workdir)
    path = os.path.join(workdir, LOCK_FILE)
    with _locked(workdir, path) as created:
        try:
            yield
        finally:
            with contextlib.suppress(OSError):  # the workdir may have been removed meanwhile
                if created and os.listdir(workdir) == [LOCK_FILE]:
                    os.remove(path)  # still held: one that opened it meanwhile retries
                    if made:
                        os.rmdir(workdir)


@contextlib.contextmanager
def _locked(workdir: str, path: str) -> Iterator[bool]:
    """Hold the lock file ``path``; whether it was created here."""
    while True:
        created = not os.path.exists(path)
        try:
            f = open(path, "a+")  # noqa: SIM115 - held open until the lock is released
        except OSError as e:
            raise ValueError(f"cannot write {path!r}: {e.strerror}") from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise ValueError(
                f"workdir {workdir!r} is in use by another process ({holder}); wait for it to "
                "finish or stop it, or choose another --workdir"
            ) from None
        if _same_file(f, path):
            break
        f.close()  # removed by the holder as it released it: lock the file at the path now
    with f:
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}: {' '.join(sys.argv)[:200]}\n")
        f.flush()
        try:
            yield created
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _same_file(f: object, path: str) -> bool:
    try:
        return os.path.samestat(os.fstat(f.fileno()), os.stat(path))  # type: ignore[attr-defined]
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def empty_folders_removed(folder: str) -> Iterator[None]:
    """On an error inside, remove ``folder``'s folders that hold no file if the block created
    ``folder`` (a run refused for its data leaves no empty ``data_cache/``)."""
    made = not os.path.exists(folder)
    try:
        yield
    except BaseException:
        if made:
            for root, _, _ in os.walk(folder, topdown=False):
                with contextlib.suppress(OSError):
                    os.rmdir(root)  # refused where a file remains
        raise
