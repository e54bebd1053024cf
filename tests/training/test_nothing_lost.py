"""Nothing lost: a run's checkpoints, config and history survive config changes, bit rot,
a second process and Ctrl-C; a user's mistake is one line, before anything is written."""

import gzip
import json
import os
import shutil
import signal
import struct
import subprocess
import sys

import orbax.checkpoint as ocp
import pytest
from conftest import flip_a_bit
from test_loop import (  # noqa: F401 - fixtures
    ROOT,
    losses,
    micro_config,
    prepared,
    run_train,
    wait_for,
    workdir_from,
)

from transformer_jax.data import pipeline, preparation, sources
from transformer_jax.data.synthetic import synthetic_pairs
from transformer_jax.data.tokenizer import load_tokenizer
from transformer_jax.training import checkpoints, loop, run
from transformer_jax.training.averaging import average_checkpoints
from transformer_jax.training.logs import read_metrics
from transformer_jax.training.run import CONFIG_HISTORY_FILE
from transformer_jax.training.schema import RunConfig
from transformer_jax.training.validation import validate_config
from transformer_jax.training.workdir import prepare_workdir


def snapshot(workdir):
    """Every file of a workdir with its bytes (what must survive a refused start)."""
    files = {}
    for base, _, names in os.walk(workdir):
        for name in names:
            path = os.path.join(base, name)
            if name != "workdir.lock":
                files[os.path.relpath(path, workdir)] = open(path, "rb").read()
    return files


@pytest.fixture(scope="module")
def trained(prepared, tmp_path_factory):  # noqa: F811
    """A finished 4-step micro run with checkpoints at steps 2 and 4."""
    tmp = tmp_path_factory.mktemp("trained")
    config, _ = micro_config(tmp, steps=4, every=2)
    workdir = workdir_from(prepared, tmp / "run")
    loop.train_and_evaluate(RunConfig.from_config(config), workdir)
    return config, workdir


@pytest.mark.parametrize(
    "field, value",
    [("num_encoder_layers", 2), ("d_model", 64), ("positional", "learned"), ("vocab_size", 400)],
)
def test_a_config_change_is_refused_before_anything_is_written(trained, tmp_path, field, value):
    config, original = trained
    workdir = str(tmp_path / "run")
    shutil.copytree(original, workdir)
    before = snapshot(workdir)
    config = config.copy_and_resolve_references()
    config.model[field] = value
    with pytest.raises(ValueError, match=rf"model\.{field}: .* -> .*Nothing was changed"):
        loop.train_and_evaluate(RunConfig.from_config(config), workdir)
    assert snapshot(workdir) == before


@pytest.mark.parametrize(
    "field, value", [("train.weight_decay", 0.1), ("model.word_dropout_rate", 0.1)]
)
def test_a_field_the_saved_config_lacks_counts_as_its_default(trained, tmp_path, field, value):
    """A run saved before a field existed resumes with the field at its default, and is
    refused with any other value (the optimizer state would not even match)."""
    config, original = trained
    workdir = str(tmp_path / "run")
    shutil.copytree(original, workdir)
    section, name = field.split(".")
    path = os.path.join(workdir, "config.json")
    saved = json.load(open(path))
    del saved[section][name]
    with open(path, "w") as f:
        json.dump(saved, f)
    before = snapshot(workdir)
    changed = config.copy_and_resolve_references()
    changed[section][name] = value
    with pytest.raises(ValueError, match=rf"{field}: 0\.0 -> 0\.1.*Nothing was changed"):
        loop.train_and_evaluate(RunConfig.from_config(changed), workdir)
    assert snapshot(workdir) == before
    assert run.check_resumable(RunConfig.from_config(config), workdir) == saved


def test_a_resumable_change_is_recorded_and_config_json_follows(trained, tmp_path):
    config, original = trained
    workdir = str(tmp_path / "run")
    shutil.copytree(original, workdir)
    config = config.copy_and_resolve_references()
    config.train.num_steps = 5
    result = loop.train_and_evaluate(RunConfig.from_config(config), workdir)
    assert result["step"] == 5
    assert json.load(open(os.path.join(workdir, "config.json")))["train"]["num_steps"] == 5
    (record,) = [json.loads(line) for line in open(os.path.join(workdir, CONFIG_HISTORY_FILE))]
    assert record["step"] == 4 and record["changed"] == {"train.num_steps": [4, 5]}


def test_a_checkpoint_of_other_shapes_is_a_mismatch_not_unreadable(trained, tmp_path):
    config, original = trained
    workdir = str(tmp_path / "run")
    shutil.copytree(original, workdir)
    os.remove(os.path.join(workdir, "config.json"))  # only the checkpoint itself can tell
    config = config.copy_and_resolve_references()
    config.model.d_ff = 128
    with pytest.raises(checkpoints.CheckpointMismatch, match="shape"):
        loop.train_and_evaluate(RunConfig.from_config(config), workdir)
    assert checkpoints.list_steps(workdir) == [2, 4]
    assert not any(
        "unreadable" in name for name in os.listdir(os.path.join(workdir, "checkpoints"))
    )


def tensorboard_steps(workdir, tag="loss"):
    """Steps of the ``tag`` scalars in all TensorBoard event files of a run."""
    from tensorboardX.proto.event_pb2 import Event

    steps = []
    directory = os.path.join(workdir, "tensorboard")
    for name in sorted(os.listdir(directory)):
        data = open(os.path.join(directory, name), "rb").read()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            steps += [event.step for v in event.summary.value if v.tag == tag]
    return sorted(steps)


def test_a_flipped_bit_is_caught_and_the_previous_checkpoint_used(trained, tmp_path, capsys):
    config, original = trained
    workdir = str(tmp_path / "run")
    shutil.copytree(original, workdir)
    flip_a_bit(os.path.join(workdir, "checkpoints", "4", "params"))
    capsys.readouterr()
    loop.train_and_evaluate(RunConfig.from_config(config), workdir)
    out = capsys.readouterr().out
    assert "checkpoint 4 in" in out and "is unreadable" in out, out
    assert "resuming from the checkpoint at step 2" in out
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "4.unreadable"))
    assert checkpoints.list_steps(workdir) == [2, 4]
    # the history of the steps trained again reads once, in metrics.jsonl and TensorBoard
    assert [r["step"] for r in read_metrics(workdir) if "loss" in r] == [1, 2, 3, 4]
    assert tensorboard_steps(workdir) == [1, 2, 3, 4]


def hold_lock(workdir):
    code = (
        "import sys, time\n"
        f"sys.path.insert(0, {ROOT!r})\n"
        "from transformer_jax.training.workdir import lock_workdir\n"
        f"with lock_workdir({workdir!r}):\n"
        "    print('locked', flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_writer_gets_the_holders_pid(trained, tmp_path):
    config, original = trained
    workdir = str(tmp_path / "run")
    shutil.copytree(original, workdir)
    holder = hold_lock(workdir)
    try:
        before = snapshot(workdir)
        with pytest.raises(ValueError, match=rf"in use by another process \(pid {holder.pid}"):
            loop.train_and_evaluate(RunConfig.from_config(config), workdir)
        with pytest.raises(ValueError, match=rf"pid {holder.pid}"):
            average_checkpoints(workdir, 2)
        assert snapshot(workdir) == before
    finally:
        holder.kill()
        holder.wait()
    steps, _ = average_checkpoints(workdir, 2)  # the OS released the dead holder's lock
    assert steps == [2, 4]


def test_non_finite_numbers_and_pad_id_are_refused(tmp_path):
    config, _ = micro_config(tmp_path)
    config.train.learning_rate_scale = float("inf")
    with pytest.raises(ValueError, match="train.learning_rate_scale must be a finite number"):
        validate_config(RunConfig.from_config(config))
    config, _ = micro_config(tmp_path)
    config.model.dropout_rate = float("nan")
    with pytest.raises(ValueError, match="model.dropout_rate must be a finite number"):
        validate_config(RunConfig.from_config(config))
    config, _ = micro_config(tmp_path)
    config.model.pad_id = 5
    with pytest.raises(ValueError, match="model.pad_id=5 must be 0"):
        validate_config(RunConfig.from_config(config))


def write_text_split(directory, split, pairs):
    for side, lang in ((0, "en"), (1, "lantic")):  # configs/tiny.py's languages
        with open(os.path.join(directory, f"{split}.{lang}"), "w") as f:
            f.writelines(pair[side] + "\n" for pair in pairs)


def test_an_empty_eval_split_fails_before_the_first_step(prepared, tmp_path):  # noqa: F811
    text = tmp_path / "text"
    text.mkdir()
    write_text_split(text, "train", synthetic_pairs("train")[:200])
    write_text_split(text, "validation", [])
    write_text_split(text, "test", synthetic_pairs("test")[:5])
    config, _ = micro_config(tmp_path)
    config.data.update(source="text", text_dir=str(text))
    workdir = workdir_from(prepared, tmp_path / "run")
    with pytest.raises(ValueError, match="data.eval_split='validation' has no pair"):
        loop.train_and_evaluate(RunConfig.from_config(config), workdir)
    write_text_split(text, "validation", synthetic_pairs("validation")[:5])
    with open(text / "test.en", "a") as f:  # the test split, needed only at the end
        f.write("one line too many\n")
    config.train.final_test = True
    with pytest.raises(ValueError, match="test.en has 6 lines"):
        loop.train_and_evaluate(RunConfig.from_config(config), workdir)
    assert not os.path.exists(os.path.join(workdir, "checkpoints", "1"))
    assert not os.path.exists(os.path.join(workdir, "metrics.jsonl"))


def test_workdir_that_is_a_file_or_read_only_is_one_line(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        prepare_workdir(str(path))
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "read_only"
        locked.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="is not writable"):
            prepare_workdir(str(locked))


def train_py(*args):
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_train_py_mistakes_are_one_line_with_a_failure_code(tmp_path):
    _, config_path = micro_config(tmp_path)
    workdir = f"--workdir={tmp_path / 'run'}"
    (tmp_path / "file").write_text("x")
    cases = [
        (["--config=/no/such/config.py", workdir], 1, "does not exist"),
        (["--config=/no/such/config.py", "--config.train.num_steps=3", workdir], 1, "config.py"),
        ([f"--config={config_path}", "--config.trian.num_steps=3", workdir], 2, "trian"),
        ([f"--config={config_path}", f"--workdir={tmp_path / 'file'}"], 1, "is a file"),
        ([f"--config={ROOT}/configs/multi30k.py:45", workdir], 1, "BUDGET takes one of"),
    ]
    for args, code, message in cases:
        proc = train_py(*args)
        assert proc.returncode == code, (args, proc.stderr)
        assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not os.path.exists(tmp_path / "run")
    proc = train_py("--help")
    assert proc.returncode == 0 and "config.json" in proc.stdout and "Exit codes" in proc.stdout


def interrupt_at(monkeypatch, steps):
    """Send this process SIGINT after each step of ``steps``."""
    update = loop._Trainer.update

    def update_then_interrupt(self, step):
        update(self, step)
        if step in steps:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(loop._Trainer, "update", update_then_interrupt)


def test_ctrl_c_saves_a_checkpoint_like_sigterm(prepared, tmp_path, monkeypatch):  # noqa: F811
    config, _ = micro_config(tmp_path, steps=50, every=50)
    workdir = workdir_from(prepared, tmp_path / "run")
    interrupt_at(monkeypatch, {3})
    result = loop.train_and_evaluate(RunConfig.from_config(config), workdir)
    assert not result["complete"] and result["stopped_by"] == "SIGINT"
    assert 3 <= result["step"] <= 4  # the signal is acted on at the next step boundary
    assert checkpoints.list_steps(workdir) == [result["step"]]


def test_a_second_ctrl_c_stops_at_once(prepared, tmp_path, monkeypatch):  # noqa: F811
    config, _ = micro_config(tmp_path, steps=50, every=50)
    workdir = workdir_from(prepared, tmp_path / "run")
    interrupt_at(monkeypatch, {2, 3})
    with pytest.raises(KeyboardInterrupt):
        loop.train_and_evaluate(RunConfig.from_config(config), workdir)


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_exits_130(prepared, tmp_path):  # noqa: F811
    _, config_path = micro_config(tmp_path, steps=100000, every=100000)
    workdir = workdir_from(prepared, tmp_path / "run")
    proc = run_train(config_path, workdir, wait=False)
    metrics = os.path.join(workdir, "metrics.jsonl")
    wait_for(lambda: os.path.isfile(metrics) and max(losses(workdir), default=0) >= 3, proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    stopped_at = int(out.split("SIGINT: saved the checkpoint at step ")[1].split(";")[0])
    assert checkpoints.list_steps(workdir) == [stopped_at]


def test_text_is_checked_as_utf8(tmp_path):
    path = tmp_path / "utf16.en"
    path.write_bytes("a line\nanother\n".encode("utf-16"))
    with pytest.raises(ValueError, match="utf16.en is UTF-16"):
        sources.read_lines(str(path))
    path = tmp_path / "binary.en"
    path.write_bytes(b"abc\x00\x01\x02\n")
    with pytest.raises(ValueError, match="binary.en holds NUL bytes"):
        sources.read_lines(str(path))
    path = tmp_path / "latin1.en"
    path.write_bytes(("fine\n" + "naïve café\n" * 20).encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.en is not UTF-8: 20 of its 21 lines .* line 2"):
        sources.read_lines(str(path))
    path = tmp_path / "bom.en"
    path.write_bytes("\ufeffHello\nWorld\n".encode())
    assert sources.read_lines(str(path)) == ["Hello", "World"]


def test_truncated_files_are_one_line_or_rebuilt(prepared, tmp_path, capsys):  # noqa: F811
    path = tmp_path / "train.en.gz"
    data = gzip.compress(b"line\n" * 1000)
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cannot read .*train.en.gz"):
        sources.read_lines(str(path))
    tokenizer_path = tmp_path / "tokenizer.model"
    tokenizer_path.write_bytes((prepared / "tokenizer.model").read_bytes()[:500])
    with pytest.raises(ValueError, match="tokenizer.model is not a sentencepiece model"):
        load_tokenizer(str(tokenizer_path))
    config = RunConfig.from_config(micro_config(tmp_path)[0])
    workdir = workdir_from(prepared, tmp_path / "run")
    tokenizer = load_tokenizer(os.path.join(workdir, "tokenizer.model"))
    cache = os.path.join(workdir, "data_cache")
    (name,) = [n for n in os.listdir(cache) if n.startswith("validation-")]
    tokens = os.path.join(cache, name, "src.npy")
    good = open(tokens, "rb").read()
    open(tokens, "wb").write(good[: len(good) // 2])
    with pytest.raises(ValueError, match=r"prepared data damaged: .*src\.npy .*transformer-jax"):
        pipeline.encoded_split(config.data, "validation", tokenizer, workdir)  # as train.py
    preparation.prepare_data(config.data, workdir, tokenizer, ["validation"], rebuild=True)
    assert "warning: prepared data damaged" in capsys.readouterr().err  # as prepare does
    encoded = pipeline.encoded_split(config.data, "validation", tokenizer, workdir)
    assert len(encoded) == 1000 and open(tokens, "rb").read() == good


def test_a_failed_save_is_reported_at_once(trained, tmp_path, monkeypatch):
    config, original = trained
    workdir = str(tmp_path / "run")
    shutil.copytree(original, workdir)
    config = config.copy_and_resolve_references()
    config.train.update(num_steps=12, checkpoint_every=4)
    failed = []
    save = ocp.CheckpointManager.save

    def save_then_fail(self, step, *args, **kwargs):
        failed.append(step)  # the disk fills while this save is written
        return save(self, step, *args, **kwargs)

    def check_for_errors(self):
        if failed:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(ocp.CheckpointManager, "save", save_then_fail)
    monkeypatch.setattr(ocp.CheckpointManager, "check_for_errors", check_for_errors)
    with pytest.raises(OSError, match="saving checkpoint 8 .* No space left on device"):
        loop.train_and_evaluate(RunConfig.from_config(config), workdir)
    assert max(losses(workdir)) < 12  # stopped at the step after the failed save
