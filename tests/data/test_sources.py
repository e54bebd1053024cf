"""Parallel text sources: plain/gzip text files, TFDS (mocked, no TensorFlow), synthetic."""

import gzip
import logging
import time

import pytest
import tensorflow_datasets as tfds

from transformer_jax.data import sources
from transformer_jax.data.config import DataConfig
from transformer_jax.data.sources import (
    ReadCounts,
    load_pairs,
    stream_parallel_text,
    stream_tfds,
)


def read_parallel_text(src_path, tgt_path):
    counts = ReadCounts()
    return list(stream_parallel_text(src_path, tgt_path, counts)), counts.skipped_empty


def read_tfds(name, split, src_lang, tgt_lang, data_dir=None):
    counts = ReadCounts()
    return list(stream_tfds(name, split, src_lang, tgt_lang, counts, data_dir)), counts


def data_config(**changes):
    return DataConfig(**changes)


def write(path, data: bytes, compress=False):
    if compress:
        data = gzip.compress(data)
    path.write_bytes(data)
    return str(path)


def test_text_files_plain_and_gzip(tmp_path):
    write(tmp_path / "train.en", b"a cat\nthe dog\n")
    write(tmp_path / "train.de.gz", b"eine Katze\nder Hund\n", compress=True)
    config = data_config(source="text", text_dir=str(tmp_path))
    assert load_pairs(config, "train") == [("a cat", "eine Katze"), ("the dog", "der Hund")]
    reverse = data_config(source="text", text_dir=str(tmp_path), src_lang="de", tgt_lang="en")
    assert load_pairs(reverse, "train")[0] == ("eine Katze", "a cat")


def test_empty_lines_and_bad_bytes_are_skipped_and_counted(tmp_path, caplog):
    src = write(tmp_path / "x.en", b"one\n\n  \nfour \xff\xfe\r\nfive\x0bstill five\nsix")
    tgt = write(tmp_path / "x.de", b"eins\nzwei\ndrei\nvier\nfuenf\n\t\n")
    pairs, skipped = read_parallel_text(src, tgt)
    assert pairs == [
        ("one", "eins"),
        ("four \ufffd\ufffd", "vier"),
        ("five\x0bstill five", "fuenf"),
    ]
    assert skipped == 3
    with caplog.at_level(logging.INFO):
        load_pairs(data_config(source="text", text_dir=str(tmp_path)), "x")
    assert "skipped 3" in caplog.text


def test_text_errors(tmp_path):
    write(tmp_path / "train.en", b"a\nb\nc\n")
    write(tmp_path / "train.de", b"a\nb\n")
    config = data_config(source="text", text_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"train\.en has 3 lines.*train\.de has 2"):
        load_pairs(config, "train")
    with pytest.raises(ValueError, match=r"missing text file .*test\.en"):
        load_pairs(config, "test")
    with pytest.raises(ValueError, match="data.text_dir"):
        load_pairs(data_config(source="text"), "train")


def test_unknown_source():
    with pytest.raises(
        ValueError, match=r"data\.source must be one of \('tfds', 'text', 'synthetic'\)"
    ):
        load_pairs(data_config(source="csv"), "train")


def test_synthetic_source():
    pairs = load_pairs(data_config(source="synthetic"), "validation")
    assert len(pairs) == 1000 and all(s and t for s, t in pairs)


def test_tfds_by_language_key_without_tensorflow(monkeypatch):
    # mock_data stands in for the download: no probe of the network for an unprepared dataset
    monkeypatch.setattr(sources, "_unreachable", lambda url, timeout: None)
    config = data_config(source="tfds", tfds_name="wmt14_translate/de-en")
    with tfds.testing.mock_data(num_examples=6):
        en_de = load_pairs(config, "train")
        de_en, _ = read_tfds("wmt14_translate/de-en", "train", "de", "en")
        with pytest.raises(ValueError, match=r"data\.tgt_lang='fr'.*\['de', 'en'\]"):
            read_tfds("wmt14_translate/de-en", "train", "en", "fr")
    assert len(en_de) == 6 and all(isinstance(s, str) and isinstance(t, str) for s, t in en_de)
    assert de_en == [(t, s) for s, t in en_de]


def test_tfds_unknown_dataset():
    with pytest.raises(ValueError, match="data.tfds_name='no_such_dataset'"):
        read_tfds("no_such_dataset", "train", "en", "de")


def test_tfds_not_prepared_and_offline_fails_at_once_with_one_line(tmp_path, monkeypatch):
    """No retries: an unprepared dataset with the network down (here: a proxy that refuses)
    is refused in seconds, naming the dataset, the folder TFDS looked in and a command to
    prepare it; nothing is written and TFDS's download is never started."""
    for proxy in ("https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(proxy, "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.setattr(tfds, "data_source", lambda *a, **k: pytest.fail("TFDS downloads"))
    started = time.monotonic()
    with pytest.raises(ValueError) as error:
        read_tfds("wmt14_translate/de-en", "train", "en", "de", str(tmp_path))
    assert time.monotonic() - started < 10
    (line,) = str(error.value).splitlines()
    folder = tmp_path / "wmt14_translate" / "de-en"
    assert f"data.tfds_name='wmt14_translate/de-en' is not prepared in {folder}" in line
    assert "network is unreachable" in line and "transformer-jax prepare" not in line
    build = "tfds build wmt14_translate/de-en --file_format=array_record --data_dir DIR"
    assert build in line and line.endswith("and set data.tfds_data_dir=DIR")
    assert list(tmp_path.iterdir()) == []


def test_tfds_not_prepared_and_a_failed_download_is_one_line(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Failed to resolve 'www.statmt.org'\nretries exceeded")

    monkeypatch.setattr(sources, "_unreachable", lambda url, timeout: None)
    monkeypatch.setattr(tfds, "data_source", offline)
    with pytest.raises(ValueError) as error:
        read_tfds("wmt14_translate/de-en", "validation", "en", "de", str(tmp_path))
    (line,) = str(error.value).splitlines()
    assert f"is not prepared in {tmp_path}" in line and "(data.tfds_data_dir=" in line
    assert "download failed (Failed to resolve 'www.statmt.org')" in line
