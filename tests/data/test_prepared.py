"""Prepared (binarized, memory-mapped) splits: the same ids, batches and resumes as the
in-memory encoding, the same bytes for any number of workers and after an interruption,
checksums (a damaged split refused in one line, prepared anew by ``prepare``; an old one
opened), streamed text/gzip/TFDS (a real ArrayRecord dataset), counts of what reading
skipped, the ``data.prepare`` command, and two processes reading disjoint shares of one
prepared split."""

import dataclasses
import gzip
import hashlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import ROOT

from transformer_jax.data import pipeline, preparation, prepared, resampled
from transformer_jax.data.batching import Batcher, TrainIterator
from transformer_jax.data.config import DataConfig
from transformer_jax.data.sources import ReadCounts, load_pairs, stream_pairs
from transformer_jax.training.schema import RunConfig
from transformer_jax.training.validation import validate_config

# Digests of tokenizer, ids and 2 x 2 x (epoch + 5) batches (bucketed and packed, process 0
# and 1 of 2) produced by the in-memory .npz pipeline this module replaced, on the corpora
# below: the prepared splits must give the same bytes. (Packed batches are yielded in the
# order first fit closes them since they are planned as read: each epoch holds the same
# packed batches as the shuffled order these digests were first taken with.)
REFERENCE = {
    "text": (2907, "34a1a4537e794cac0ef76500d918afbf6a4ac9cb"),
    "synthetic": (40000, "d2efab1a8b278e3d8116ebe148fe207a326d3259"),
}
WORDS = (
    "the a cat dog house tree runs sees big small red green blue Haus Katze Hund Baum läuft "
    "sieht groß klein rot grün blau café naïve"
).split()


def write_corpus(directory, n=3000):
    """A fixed random parallel corpus in the text layout (some source lines empty)."""
    rng = random.Random(0)
    with open(f"{directory}/train.en", "w") as f, open(f"{directory}/train.de", "w") as g:
        for _ in range(n):
            length = rng.randint(0, 30)
            f.write(" ".join(rng.choice(WORDS) for _ in range(length)) + "\n")
            g.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30))) + "\n")
    return str(directory)


def data_config(**changes):
    return DataConfig(**{"tokens_per_batch": 512, "max_len": 64, **changes})


def digest(config, workdir):
    tokenizer = preparation.get_tokenizer(config, workdir, 400)
    h = hashlib.sha1(tokenizer.model_proto)
    encoded = pipeline.encoded_split(config, "train", tokenizer, workdir)
    for array in (encoded.src, encoded.src_offsets, encoded.tgt, encoded.tgt_offsets):
        h.update(np.asarray(array).astype(np.int64).tobytes())
    for packing in (False, True):
        for process in (0, 1):
            batcher = Batcher(
                encoded,
                tokens_per_batch=512,
                max_len=64,
                packing=packing,
                num_shards=2,
                process_index=process,
                process_count=2,
            )
            iterator = TrainIterator(batcher, seed=3)
            for _ in range(len(iterator.epoch_plan(0)) + 5):
                batch = next(iterator)
                for key in sorted(batch):
                    h.update(key.encode())
                    h.update(batch[key].tobytes())
            h.update(repr(iterator.get_state()).encode())
    return (len(encoded), h.hexdigest()), tokenizer, encoded


def test_prepared_text_equals_the_in_memory_encoding(tmp_path):
    config = data_config(source="text", text_dir=write_corpus(tmp_path))
    workdir = str(tmp_path / "run")
    found, tokenizer, encoded = digest(config, workdir)
    assert found == REFERENCE["text"]
    assert isinstance(encoded.src, np.memmap) and encoded.src.dtype == np.uint16
    assert encoded.read_counts == {"skipped_empty": 93, "replaced_lines": 0}
    in_memory = preparation.encode_pairs(tokenizer, load_pairs(config, "train"))
    for name in ("src", "src_offsets", "tgt", "tgt_offsets"):
        np.testing.assert_array_equal(getattr(encoded, name), getattr(in_memory, name))


def test_a_removed_data_cache_is_prepared_again(tmp_path):
    config = data_config(source="text", text_dir=write_corpus(tmp_path, n=300))
    workdir = str(tmp_path / "run")
    tokenizer = preparation.get_tokenizer(config, workdir, 300)
    first = pipeline.encoded_split(config, "train", tokenizer, workdir)
    expected = np.array(first.src)
    shutil.rmtree(os.path.join(workdir, preparation.CACHE_DIR))
    again = pipeline.encoded_split(config, "train", tokenizer, workdir)
    np.testing.assert_array_equal(again.src, expected)


@pytest.mark.slow  # trains a tokenizer on 40,000 synthetic pairs (~10 s)
def test_prepared_synthetic_equals_the_in_memory_encoding(tmp_path):
    found, _, _ = digest(data_config(source="synthetic"), str(tmp_path))
    assert found == REFERENCE["synthetic"]


def split_digest(path):
    """The sha256 of each file of a prepared split."""
    names = sorted(n for n in os.listdir(path) if n.endswith(".npy")) + [prepared.INFO_FILE]
    return {n: hashlib.sha256(open(os.path.join(path, n), "rb").read()).hexdigest() for n in names}


def test_workers_and_an_interruption_leave_the_same_bytes(tmp_path, monkeypatch):
    config = data_config(source="text", text_dir=write_corpus(tmp_path), prepare_workers=2)
    workdir = str(tmp_path / "run")
    tokenizer = preparation.get_tokenizer(config, workdir, 400)
    path = preparation.prepared_path(config, "train", tokenizer, workdir)
    spool = preparation.spool_path(config, "train", workdir)
    assert os.path.isdir(spool)  # the tokenizer's pass, read by two workers
    preparation.prepare_split(config, "train", tokenizer, workdir, chunk_pairs=500)
    assert not os.path.exists(spool) and not os.path.exists(f"{path}.lock")
    two = split_digest(path)
    written, info = prepared.open_split(path)
    whole = preparation.encode_pairs(tokenizer, load_pairs(config, "train"))
    for name in ("src", "src_offsets", "tgt", "tgt_offsets"):
        np.testing.assert_array_equal(getattr(written, name), getattr(whole, name))
    expected = {"pairs": 2907, "dtype": "uint16", "skipped_empty": 93, "replaced_lines": 0}
    assert {k: info[k] for k in expected} == expected
    assert info["max_id"] == int(max(whole.src.max(), whole.tgt.max()))
    assert sorted(info["files"]) == ["src.npy", "src_offsets.npy", "tgt.npy", "tgt_offsets.npy"]

    encode, calls = preparation.encode_pairs, []

    def interrupted(tok, chunk, num_threads=-1):  # stopped while encoding the third chunk
        calls.append(len(chunk))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return encode(tok, chunk, num_threads)

    shutil.rmtree(path)
    config = dataclasses.replace(config, prepare_workers=1)  # from the text files, here
    monkeypatch.setattr(preparation, "encode_pairs", interrupted)
    with pytest.raises(KeyboardInterrupt):
        preparation.prepare_split(config, "train", tokenizer, workdir, chunk_pairs=500)
    assert not os.path.exists(path) and calls == [500, 500, 500]
    monkeypatch.setattr(preparation, "encode_pairs", encode)
    config = dataclasses.replace(config, prepare_workers=2)  # its last 4 chunks by two
    preparation.prepare_split(config, "train", tokenizer, workdir, chunk_pairs=500)
    assert not os.path.exists(f"{path}.partial-500") and split_digest(path) == two
    shutil.rmtree(path)
    config = dataclasses.replace(config, prepare_workers=1)
    preparation.prepare_split(config, "train", tokenizer, workdir, chunk_pairs=500)
    assert split_digest(path) == two


def flip_a_byte(path, offset=200):
    data = bytearray(open(path, "rb").read())
    data[offset] ^= 0x04
    open(path, "wb").write(bytes(data))


def test_a_damaged_split_is_refused_in_one_line_and_prepare_rebuilds_it_alone(tmp_path, capsys):
    config = data_config(source="text", text_dir=write_corpus(tmp_path))
    for lang in ("en", "de"):
        shutil.copy(tmp_path / f"train.{lang}", tmp_path / f"validation.{lang}")
    workdir = str(tmp_path / "run")
    tokenizer = preparation.get_tokenizer(config, workdir, 400)
    preparation.prepare_data(config, workdir, tokenizer, ["train", "validation"])
    good = np.array(pipeline.encoded_split(config, "train", tokenizer, workdir).src)
    train, dev = (
        preparation.prepared_path(config, s, tokenizer, workdir) for s in ("train", "validation")
    )
    kept = {p: os.stat(p).st_mtime_ns for p in (f"{workdir}/tokenizer.model", f"{dev}/src.npy")}
    flip_a_byte(f"{train}/src.npy")  # one token id changed, the sizes kept
    with pytest.raises(prepared.DamagedSplit) as e:
        pipeline.encoded_split(config, "train", tokenizer, workdir)
    assert str(e.value) == (
        f"prepared data damaged: {train}/src.npy (CRC-32 {prepared._crc32(f'{train}/src.npy')} "
        f"where {prepared._read_info(train)['files']['src.npy']['crc32']} was written); "
        f"rebuild it with: transformer-jax prepare --workdir {workdir} and this run's --config and "
        "overrides"
    )
    with open(f"{train}/tgt_offsets.npy", "r+b") as f:
        f.truncate(1)
    with pytest.raises(prepared.DamagedSplit, match=r"tgt_offsets\.npy \(1 bytes where \d+ were"):
        preparation.prepare_data(config, workdir, tokenizer, ["train"])  # as train.py does
    capsys.readouterr()
    preparation.prepare_data(config, workdir, tokenizer, ["train", "validation"], rebuild=True)
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning")]
    assert line.startswith(f"warning: prepared data damaged: {train}/tgt_offsets.npy (1 bytes")
    np.testing.assert_array_equal(
        pipeline.encoded_split(config, "train", tokenizer, workdir).src, good
    )
    assert kept == {p: os.stat(p).st_mtime_ns for p in kept}  # the tokenizer and dev untouched


def test_a_split_prepared_without_checksums_opens_and_records_them(tmp_path, capsys):
    config = data_config(source="text", text_dir=write_corpus(tmp_path, n=300))
    workdir = str(tmp_path / "run")
    tokenizer = preparation.get_tokenizer(config, workdir, 300)
    path = preparation.prepare_split(config, "train", tokenizer, workdir)
    info = prepared._read_info(path)
    old = {k: v for k, v in info.items() if k != "files"}  # info.json as written before
    with open(f"{path}/{prepared.INFO_FILE}", "w") as f:
        json.dump(old, f)
    prepared._verified.clear()
    capsys.readouterr()
    encoded, opened = prepared.open_split(path)
    assert opened == info and prepared._read_info(path) == info
    assert len(encoded) == info["pairs"] > 0
    assert capsys.readouterr().err == (
        f"note: {path} was prepared without checksums: they are recorded now from its files\n"
    )
    flip_a_byte(f"{path}/tgt.npy")
    with pytest.raises(prepared.DamagedSplit, match="tgt.npy"):
        prepared.open_split(path)
    with open(f"{path}/{prepared.INFO_FILE}", "w") as f:
        f.write('{"pairs": 3, "files": 1}')
    with pytest.raises(prepared.DamagedSplit, match=r"info\.json \(its checksums are unreadable"):
        prepared.open_split(path)


def test_gzip_text_counts_what_it_skips_and_replaces(tmp_path):
    lines = [b"a cat", b"caf\xe9", b"", b"the dog"] + [b"fine"] * 196
    (tmp_path / "train.en.gz").write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    (tmp_path / "train.de").write_bytes(
        b"eine Katze\nCaf\xc3\xa9\nleer\nder Hund\n" + b"gut\n" * 196
    )
    counts = ReadCounts()
    config = data_config(source="text", text_dir=str(tmp_path))
    pairs = list(stream_pairs(config, "train", counts))
    assert pairs[:3] == [("a cat", "eine Katze"), ("caf\ufffd", "Café"), ("the dog", "der Hund")]
    assert counts.as_dict() == {"skipped_empty": 1, "replaced_lines": 1}


def test_a_corrupt_gzip_file_is_one_line_naming_it(tmp_path):
    data = bytearray(gzip.compress(b"line\n" * 5000))
    data[len(data) // 2 : len(data) // 2 + 8] = b"\xff" * 8  # a damaged deflate stream
    (tmp_path / "train.en.gz").write_bytes(bytes(data))
    (tmp_path / "train.de").write_bytes(b"Zeile\n" * 5000)
    config = data_config(source="text", text_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"^cannot read .*train\.en\.gz: ") as e:
        load_pairs(config, "train")
    assert "\n" not in str(e.value)


def array_record_dataset(data_dir, n=2500):
    """A real TFDS dataset in ArrayRecord files (the format ``data.source='tfds'`` reads)."""
    import tensorflow_datasets as tfds

    class TinyTranslate(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            text = tfds.features.Text()
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.FeaturesDict({"en": text, "de": text})
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for i in range(n):
                yield i, {"en": f"the sentence {i}", "de": "" if i == 7 else f"der Satz {i}"}

    TinyTranslate(data_dir=data_dir, file_format="array_record").download_and_prepare()
    return "tiny_translate"


def test_tfds_array_record_is_read_in_batches(tmp_path, monkeypatch):
    from array_record.python import array_record_data_source

    name = array_record_dataset(str(tmp_path / "tfds"))
    config = data_config(source="tfds", tfds_name=name, tfds_data_dir=str(tmp_path / "tfds"))
    batched = []
    getitems = array_record_data_source.ArrayRecordDataSource.__getitems__
    monkeypatch.setattr(
        array_record_data_source.ArrayRecordDataSource,
        "__getitems__",
        lambda self, keys: batched.append(len(keys)) or getitems(self, keys),
    )
    counts = ReadCounts()
    pairs = list(stream_pairs(config, "train", counts))
    assert batched == [1024, 1024, 452] and counts.skipped_empty == 1
    assert sorted(pairs) == sorted(
        (f"the sentence {i}", f"der Satz {i}") for i in range(2500) if i != 7
    )
    workdir, batched[:] = str(tmp_path / "run"), []
    tokenizer = preparation.get_tokenizer(config, workdir, 300)
    assert batched == [1024, 1024, 452]  # read once: the tokenizer's pass is kept for encoding
    encoded = pipeline.encoded_split(config, "train", tokenizer, workdir)
    assert batched == [1024, 1024, 452] and encoded.read_counts["skipped_empty"] == 1
    assert os.listdir(os.path.join(workdir, "data_cache")) == [
        os.path.basename(preparation.prepared_path(config, "train", tokenizer, workdir))
    ]  # the spool is removed once the split is prepared
    in_memory = preparation.encode_pairs(tokenizer, pairs)
    for name in ("src", "src_offsets", "tgt", "tgt_offsets"):
        np.testing.assert_array_equal(getattr(encoded, name), getattr(in_memory, name))


@pytest.mark.slow  # two command processes (~14 s)
def test_the_prepare_command(tmp_path):
    data_dir = str(tmp_path / "prepared")
    command = [sys.executable, "-m", "transformer_jax.data.prepare", "--workdir", str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [*command, "--data_dir", data_dir, "--config.train.final_test=False"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "preparing train" in done.stderr and "100%" in done.stderr
    assert sorted(n.split("-")[0] for n in os.listdir(data_dir)) == ["train", "validation"]
    bad = subprocess.run(
        [*command, "--config.data.source=text", f"--config.data.text_dir={tmp_path}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1].startswith("error: missing text file")


SHARE = textwrap.dedent(
    """
    import json, sys
    from transformer_jax.data import pipeline, preparation
    from transformer_jax.multihost import distributed
    from transformer_jax.data.config import DataConfig

    port, index, text_dir, workdir = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    assert distributed.initialize(False, coordinator_address=f"127.0.0.1:{port}",
                                  num_processes=2, process_id=index)
    config = DataConfig(source="text", text_dir=text_dir, tokens_per_batch=512, max_len=64)
    tokenizer = preparation.load_tokenizer(f"{workdir}/tokenizer.model")

    def prepare():
        preparation.prepare_data(config, workdir, tokenizer, ["train"])
        return b""

    distributed.from_process_zero(prepare)
    iterator = pipeline.train_iterator(config, workdir, tokenizer, num_shards=2)
    rows = [next(iterator)["src"].tolist() for _ in range(12)]
    print("ROWS " + json.dumps({"rows": rows, "mapped": type(iterator.batcher.pairs.src).__name__}))
    """
)


@pytest.mark.integration  # two jax.distributed processes on 127.0.0.1
def test_two_processes_read_disjoint_shares_of_one_prepared_split(tmp_path):
    config = data_config(source="text", text_dir=write_corpus(tmp_path))
    workdir = str(tmp_path / "run")
    tokenizer = preparation.get_tokenizer(config, workdir, 400)  # before: only the data is shared
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "SLURM_", "PMI_"))}
    env.pop("JAX_COORDINATOR_ADDRESS", None)
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SHARE, str(port), str(i), config.text_dir, workdir],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert [o.count("pairs prepared in") for o in outputs] == [1, 0]  # process 0 alone
    shares = [json.loads(o.split("ROWS ")[1]) for o in outputs]
    assert [s["mapped"] for s in shares] == ["memmap", "memmap"]
    iterator = pipeline.train_iterator(config, workdir, tokenizer, num_shards=2)
    for step in range(12):  # process p holds rows p/2 of the one-process batch: disjoint shares
        whole = next(iterator)["src"]
        half = len(whole) // 2
        assert shares[0]["rows"][step] == whole[:half].tolist()
        assert shares[1]["rows"][step] == whole[half:].tolist()


def test_data_dir_must_be_a_directory(tmp_path):
    data = {"source": "synthetic", "data_dir": str(tmp_path / "file")}
    config = RunConfig.from_config({"data": data})
    validate_config(config)  # absent: created when the splits are prepared
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"^data\.data_dir='.*file' is not a directory$"):
        validate_config(config)


def test_bpe_dropout_reads_the_sources_mapped_from_the_prepared_split(tmp_path):
    config = data_config(source="text", text_dir=write_corpus(tmp_path))
    workdir = str(tmp_path / "run")
    tokenizer = preparation.get_tokenizer(config, workdir, 400)
    pipeline.train_iterator(config, workdir, tokenizer, num_shards=2)
    path = preparation.prepared_path(config, "train", tokenizer, workdir)
    assert prepared.open_sources(path) is None  # without dropout the split is as before
    config = dataclasses.replace(config, bpe_dropout=0.1)
    iterator = pipeline.train_iterator(config, workdir, tokenizer, num_shards=2)
    sources = prepared.open_sources(path)
    assert all(isinstance(a, np.memmap) for a in sources)
    expected = [s for s, _ in load_pairs(config, "train")]
    assert prepared.source_texts(sources, 0, len(expected)) == expected
    assert prepared.source_texts(sources, 5, 9) == expected[5:9]

    plain = pipeline.encoded_split(config, "train", tokenizer, workdir)
    sampled = iterator.batcher.pairs  # the first epoch: one chunk, drawn with its seed
    ids, counts = tokenizer.encode_sampled(expected, 0.1, resampled.chunk_seed(0, 0, 0))
    np.testing.assert_array_equal(sampled.src, ids)
    np.testing.assert_array_equal(np.diff(sampled.src_offsets), counts)
    assert sampled.src.dtype == plain.src.dtype and len(sampled.src) > len(plain.src)
    assert isinstance(sampled.src, np.memmap)  # mapped from the workdir, not held
    assert [tokenizer.decode(sampled.source(i).tolist()) for i in range(50)] == expected[:50]
    np.testing.assert_array_equal(sampled.tgt, plain.tgt)
    iterator.resample.close()
