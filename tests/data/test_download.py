"""``python -m transformer_jax.download multi30k``: a local copy of the Multi30k repository's
raw files (a ``file://`` URL, no network) laid out as the ``text`` source reads them."""

import gzip
import subprocess
import sys

import pytest

from transformer_jax.cli.download import main
from transformer_jax.data.config import DataConfig
from transformer_jax.data.download import (
    MULTI30K_LANGS,
    MULTI30K_SPLITS,
    download_multi30k,
)
from transformer_jax.data.sources import load_pairs


def raw_copy(folder, lines=MULTI30K_SPLITS):
    """``{split}.{lang}.gz`` as in the repository's ``data/task1/raw``: line i of each
    language says which split, line and language it is."""
    folder.mkdir()
    for split, count in lines.items():
        for lang in MULTI30K_LANGS:
            text = "".join(f"{split} {i} {lang}\n" for i in range(count))
            (folder / f"{split}.{lang}.gz").write_bytes(gzip.compress(text.encode()))
    return folder.as_uri()


def test_download_lays_out_the_splits_the_text_source_reads(tmp_path, capsys):
    url, dest = raw_copy(tmp_path / "raw"), tmp_path / "data" / "multi30k"
    assert main(["multi30k", "--dest", str(dest), "--base_url", url]) == 0
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        f"{split}.{lang}" for split in MULTI30K_SPLITS for lang in MULTI30K_LANGS
    )
    config = DataConfig(source="text", text_dir=str(dest), src_lang="en", tgt_lang="de")
    for split, count in MULTI30K_SPLITS.items():
        pairs = load_pairs(config, split)
        assert len(pairs) == count
        assert pairs[-1] == (f"{split} {count - 1} en", f"{split} {count - 1} de")
    assert "wrote 9 files, kept 0" in capsys.readouterr().out
    assert main(["multi30k", "--dest", str(dest), "--base_url", url]) == 0  # nothing to fetch
    assert "wrote 0 files, kept 9" in capsys.readouterr().out


def test_a_missing_or_short_file_fails_in_one_line_and_leaves_no_partial_file(tmp_path):
    url, dest = raw_copy(tmp_path / "raw"), tmp_path / "multi30k"
    (tmp_path / "raw" / "val.de.gz").write_bytes(gzip.compress(b"one line\n"))
    with pytest.raises(ValueError, match=r"val\.de\.gz has 1 lines, not 1014"):
        download_multi30k(str(dest), url)
    assert (dest / "val.en").exists() and not (dest / "val.de").exists()
    assert not list(dest.glob("*.partial"))
    (tmp_path / "raw" / "val.de.gz").unlink()
    command = [sys.executable, "-m", "transformer_jax.download", "multi30k", "--dest", str(dest)]
    cli = subprocess.run([*command, "--base_url", url], capture_output=True, text=True)
    assert cli.returncode == 1
    assert cli.stderr.startswith(f"error: could not download {url}/val.de.gz")
    assert cli.stderr.count("\n") == 1 and "Traceback" not in cli.stderr


def test_only_the_languages_asked_for(tmp_path, capsys):
    url, dest = raw_copy(tmp_path / "raw"), tmp_path / "multi30k"
    assert main(["multi30k", "--dest", str(dest), "--base_url", url, "--langs", "en,fr"]) == 0
    assert {p.suffix for p in dest.iterdir()} == {".en", ".fr"}
    assert main(["multi30k", "--dest", str(dest), "--base_url", url, "--langs", "en,cs"]) == 2
    assert "--langs" in capsys.readouterr().err


def test_without_network_nothing_is_left_and_the_line_says_how_to_get_the_files(tmp_path):
    """A host that cannot be reached (here: a closed port): one line naming the repository's
    URL and ``--base_url=file://``, and no ``data/multi30k/`` left behind."""
    dest = tmp_path / "data" / "multi30k"
    command = [sys.executable, "-m", "transformer_jax.download", "multi30k", "--dest", str(dest)]
    cli = subprocess.run(
        [*command, "--base_url", "http://127.0.0.1:9"], capture_output=True, text=True
    )
    assert cli.returncode == 1 and cli.stderr.count("\n") == 1, cli.stderr
    assert cli.stderr.startswith("error: could not download http://127.0.0.1:9/train.en.gz")
    assert "github.com/multi30k/dataset's data/task1/raw" in cli.stderr
    assert "--base_url=file:///F" in cli.stderr
    assert list(tmp_path.iterdir()) == []
