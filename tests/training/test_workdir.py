"""training.workdir: the lock leaves nothing behind in a workdir the run did not write to,
and the empty folders a refused run made are removed."""

import os

import pytest

from transformer_jax.training.workdir import LOCK_FILE, empty_folders_removed, lock_workdir


def test_a_workdir_left_empty_is_removed_with_its_lock(tmp_path):
    workdir = tmp_path / "run"
    with lock_workdir(str(workdir)):
        assert (workdir / LOCK_FILE).is_file()
    assert not workdir.exists()

    with pytest.raises(ValueError, match="refused"), lock_workdir(str(workdir)):
        raise ValueError("refused")
    assert not workdir.exists()

    workdir.mkdir()  # made by the user: kept, without the lock
    with lock_workdir(str(workdir)):
        pass
    assert workdir.is_dir() and os.listdir(workdir) == []


def test_a_workdir_written_to_keeps_its_files_and_lock(tmp_path):
    workdir = tmp_path / "run"
    with lock_workdir(str(workdir)):
        (workdir / "config.json").write_text("{}")
    assert sorted(os.listdir(workdir)) == ["config.json", LOCK_FILE]
    with lock_workdir(str(workdir)):  # the lock file already there: reused and kept
        pass
    assert sorted(os.listdir(workdir)) == ["config.json", LOCK_FILE]


def test_only_the_empty_folders_of_a_block_that_failed_are_removed(tmp_path):
    cache = tmp_path / "data_cache"
    with pytest.raises(ValueError), empty_folders_removed(str(cache)):
        (cache / "train-0123" / "tmp").mkdir(parents=True)
        (cache / "validation-4567").mkdir()
        (cache / "validation-4567" / "src.npy").write_bytes(b"x")
        raise ValueError("the test split is missing")
    assert sorted(p.name for p in cache.iterdir()) == ["validation-4567"]

    with empty_folders_removed(str(cache / "new")):  # no error: nothing removed
        (cache / "new").mkdir()
    assert (cache / "new").is_dir()
    (cache / "new").rmdir()
    with pytest.raises(ValueError), empty_folders_removed(str(cache)):  # it existed: kept
        (cache / "empty").mkdir()
        raise ValueError("missing")
    assert (cache / "empty").is_dir()


def test_a_lock_file_removed_by_its_holder_meanwhile_is_not_the_lock(tmp_path, monkeypatch):
    """Opened just before its holder removed it on the way out: the lock taken is that of
    the file at the path now, not of the removed one (two writers otherwise)."""
    from transformer_jax.training import workdir as module

    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / LOCK_FILE).write_text("pid 1: an earlier run\n")
    flock, calls = module.fcntl.flock, []

    def removed_first(f, operation):
        calls.append(operation)
        if len(calls) == 1:  # the holder removes it between our open and our lock
            os.remove(workdir / LOCK_FILE)
        return flock(f, operation)

    monkeypatch.setattr(module.fcntl, "flock", removed_first)
    with lock_workdir(str(workdir)):
        assert (workdir / LOCK_FILE).read_text().startswith(f"pid {os.getpid()}:")
    assert len(calls) == 3  # the removed file, the new one, its release
