"""The training loop end to end on the embedded data with a micro model: training, logs,
evaluation, exact resume after SIGKILL, SIGTERM, SIGUSR1 snapshots, NaN stop, bad configs,
TFDS (mocked)."""

import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import ROOT as REPO_ROOT

from transformer_jax.cli.translate import main as translate_main
from transformer_jax.data import pipeline, preparation, sources
from transformer_jax.inference.runs import load
from transformer_jax.kernels import vectors
from transformer_jax.multihost.signals import Signals
from transformer_jax.training import checkpoints, loop
from transformer_jax.training.logs import read_metrics
from transformer_jax.training.loop import train_and_evaluate
from transformer_jax.training.schema import RunConfig
from transformer_jax.training.validation import validate_config

ROOT = str(REPO_ROOT)

MICRO = """
import os, sys
sys.path.insert(0, {root!r})
from configs.tiny import get_config as tiny


def get_config():
    config = tiny()
    config.model.update(vocab_size=300, d_model=32, num_heads=2, d_ff=64,
                        num_encoder_layers=1, num_decoder_layers=1)
    config.data.update(tokens_per_batch=256, tokenizer_train_sentences=2000)
    config.train.update(num_steps={steps}, warmup_steps=10, log_every=1, checkpoint_every={every},
                        eval_sentences=0, final_test=False, keep_checkpoints=50)
    return config
"""


def micro_config(tmp_path, steps=8, every=4):
    path = tmp_path / f"micro_{steps}_{every}.py"
    path.write_text(MICRO.format(root=ROOT, steps=steps, every=every))
    sys.path.insert(0, ROOT)
    from configs.tiny import get_config  # noqa: F401  (the micro config imports it)

    namespace = {}
    exec(path.read_text(), namespace)
    return namespace["get_config"](), str(path)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A workdir holding the micro run's tokenizer and encoded splits, copied into others."""
    tmp = tmp_path_factory.mktemp("prepared")
    config = RunConfig.from_config(micro_config(tmp)[0])
    tokenizer = preparation.get_tokenizer(config.data, str(tmp), config.model.vocab_size)
    for split in ("train", "validation", "test"):
        pipeline.encoded_split(config.data, split, tokenizer, str(tmp))
    return tmp


def workdir_from(prepared, path):
    os.makedirs(path, exist_ok=True)
    shutil.copy(prepared / "tokenizer.model", path)
    shutil.copytree(prepared / "data_cache", os.path.join(path, "data_cache"))
    return str(path)


def losses(workdir):
    return {r["step"]: (r["loss"], r["accuracy"]) for r in read_metrics(workdir) if "loss" in r}


def run_train(config_path, workdir, wait=True, overrides=()):
    # XLA's default vector width, which this process compiles with (train.py would choose
    # 512 on AVX-512): one compilation cache, and losses equal to in-process runs' bits.
    flags = os.environ.get("XLA_FLAGS", "")
    if vectors.FLAG not in flags:
        flags = f"{flags} {vectors.FLAG}=256".strip()
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", XLA_FLAGS=flags)
    cmd = [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        f"--config={config_path}",
        f"--workdir={workdir}",
        *overrides,
    ]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if wait:
        out, _ = proc.communicate(timeout=300)
        return proc.returncode, out
    return proc


def wait_for(predicate, proc, timeout=120):
    end = time.time() + timeout
    while not predicate():
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < end, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_train_py_trains_the_variants_the_config_names(prepared, tmp_path):
    """``--config.model.positional=rope --config.model.ffn=swiglu
    --config.model.norm_type=rms``: the run trains and saves that model."""
    _, config_path = micro_config(tmp_path, steps=2, every=2)
    workdir = workdir_from(prepared, tmp_path / "run")
    names = ["--config.model.positional=rope", "--config.model.ffn=swiglu"]
    code, out = run_train(config_path, workdir, overrides=[*names, "--config.model.norm_type=rms"])
    assert code == 0, out[-3000:]
    config, params, step = checkpoints.load_run(workdir)
    assert step == 2
    assert (config.model.positional, config.model.ffn, config.model.norm_type) == (
        "rope", "swiglu", "rms"
    )  # fmt: skip
    layer = params["decoder"]["layer_0"]
    assert set(layer["ffn"]) == {"gate", "value", "out"}  # SwiGLU
    assert set(layer["ffn_block"]["norm"]) == {"scale"}  # RMSNorm: no bias


def test_train_end_to_end_then_resume_says_complete(prepared, tmp_path, capsys):
    config, _ = micro_config(tmp_path, steps=6, every=3)
    config.train.update(final_test=True, test_sentences=4, eval_sentences=4, samples=2)
    config.decode.beam_size = 1  # greedy: compiles faster; beam search has its own tests
    workdir = workdir_from(prepared, tmp_path / "run")
    result = train_and_evaluate(RunConfig.from_config(config), workdir)
    out = capsys.readouterr().out
    assert result["complete"] and result["step"] == 6
    assert "evaluating step 6 on validation ..." in out and "evaluating step 6 on test" in out
    assert "test (4 sentences)" in out and "bleu" in out and "translation:" in out
    assert np.isfinite(result["test_bleu"]) and np.isfinite(result["eval_perplexity"])
    records = read_metrics(workdir)
    assert [r["step"] for r in records if "learning_rate" in r] == list(range(1, 7))
    first = records[0]
    for key in (
        "loss",
        "accuracy",
        "grad_norm",
        "learning_rate",
        "tokens_per_sec",
        "padding_efficiency",
        "dropped_too_long",
    ):
        assert key in first
    assert all(r["grad_norm"] > 0 and np.isfinite(r["grad_norm"]) for r in records[:6])
    assert "test_bleu" in records[-1] and "eval_loss" in records[-1]
    assert os.listdir(os.path.join(workdir, "tensorboard"))
    assert json.load(open(os.path.join(workdir, "config.json")))["train"]["num_steps"] == 6
    assert checkpoints.list_steps(workdir) == [3, 6]
    run_config, params, step = checkpoints.load_run(workdir)
    assert step == 6 and run_config.model.d_model == 32 and "shared_embed" in params
    assert checkpoints.load_run(workdir, 3)[2] == 3
    with pytest.raises(ValueError, match="available steps"):
        checkpoints.load_run(workdir, 5)
    again = train_and_evaluate(RunConfig.from_config(config), workdir)
    assert again == {"step": 6, "complete": True}
    out = capsys.readouterr().out
    assert "is complete" in out and "resuming" not in out


def test_a_target_vocabulary_of_the_first_pieces_trains_and_translates(tmp_path, capsys):
    """``model.tgt_vocab_size`` below ``vocab_size``: the tokenizer numbers pieces by target
    frequency, targets use the first ones, the output layer has as many rows, and the
    translate command reads the run."""
    config, _ = micro_config(tmp_path, steps=2, every=2)
    config.model.tgt_vocab_size = 150
    config.train.update(eval_sentences=4)
    config.decode.beam_size = 1
    config = RunConfig.from_config(config)
    workdir = str(tmp_path / "run")
    assert train_and_evaluate(config, workdir)["complete"]
    tokenizer = preparation.get_tokenizer(config.data, workdir, 300, 150)
    encoded = pipeline.encoded_split(config.data, "train", tokenizer, workdir)
    assert encoded.tgt.max() < 150 <= encoded.src.max()
    _, _, params, loaded = load(workdir, "latest")  # what translate and evaluate read
    assert params["shared_embed"]["embedding"].shape == (300, 32)
    assert loaded.target_vocab_size == 150
    capsys.readouterr()
    source = tmp_path / "source.txt"
    source.write_text("the big dog sees a cat\n")
    assert translate_main(["--workdir", workdir, "--beam_size", "1", "--input", str(source)]) == 0
    assert len(capsys.readouterr().out.split("\n")) == 2


def test_progress_bar_shows_a_loss_only_once_one_is_read(prepared, tmp_path, capsys):
    # Metrics are read one step late: step 1's bar has no loss to show yet, never "nan".
    config, _ = micro_config(tmp_path, steps=4, every=4)
    config.train.log_every = 4  # steps 1-3 set the bar's postfix
    train_and_evaluate(RunConfig.from_config(config), workdir_from(prepared, tmp_path / "run"))
    err = capsys.readouterr().err
    assert "loss=nan" not in err and "loss=" in err and "lr=" in err


def test_sigkill_then_resume_matches_an_uninterrupted_run_and_sigterm_saves(prepared, tmp_path):
    steps = 120
    config, config_path = micro_config(tmp_path, steps=steps, every=10)
    reference = workdir_from(prepared, tmp_path / "reference")
    train_and_evaluate(RunConfig.from_config(config), reference)

    workdir = workdir_from(prepared, tmp_path / "interrupted")
    ckpt = os.path.join(workdir, "checkpoints")
    proc = run_train(config_path, workdir, wait=False)
    wait_for(lambda: os.path.isdir(os.path.join(ckpt, "20")), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = max(losses(workdir))
    assert killed_at < steps, "the run finished before it was killed"

    proc = run_train(config_path, workdir, wait=False)  # resumes, snapshots, gets SIGTERM
    wait_for(lambda: max(losses(workdir), default=0) > killed_at + 2, proc)
    proc.send_signal(signal.SIGUSR1)  # save the parameters and go on
    snapshots = os.path.join(workdir, "snapshots")
    wait_for(
        lambda: os.path.isdir(snapshots) and any(map(str.isdigit, os.listdir(snapshots))), proc
    )
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, out  # preempted: train.py's documented exit code
    assert "resuming from the checkpoint at step" in out and "SIGTERM" in out
    stopped_at = int(out.split("SIGTERM: saved the checkpoint at step ")[1].split(";")[0])
    assert stopped_at < steps and stopped_at in checkpoints.list_steps(workdir)
    snapshot = int(out.split("SIGUSR1: saved the parameters of step ")[1].split()[0])
    assert killed_at < snapshot <= stopped_at
    assert checkpoints.load_run(workdir, f"snapshots/{snapshot}")[2] == snapshot

    code, out = run_train(config_path, workdir)
    assert code == 0, out
    assert f"resuming from the checkpoint at step {stopped_at}" in out
    assert losses(workdir) == losses(reference)  # exact: same batches, same dropout keys


@pytest.mark.slow
def test_the_first_record_after_a_resume_covers_the_whole_log_interval(
    prepared, tmp_path, monkeypatch
):
    """checkpoint_every=3, log_every=2: a run stopped at step 3 and resumed logs at step 4
    the mean of steps 3 and 4, as the uninterrupted run does."""
    config, _ = micro_config(tmp_path, steps=6, every=3)
    config.train.log_every = 2
    reference = workdir_from(prepared, tmp_path / "reference")
    train_and_evaluate(RunConfig.from_config(config), reference)
    workdir = workdir_from(prepared, tmp_path / "resumed")
    update = loop._Trainer.update

    def update_then_sigterm(self, step):
        update(self, step)
        if step == 2:  # shared with the other processes' requests at the next step
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(loop._Trainer, "update", update_then_sigterm)
    assert train_and_evaluate(RunConfig.from_config(config), workdir)["step"] == 3
    monkeypatch.setattr(loop._Trainer, "update", update)
    assert train_and_evaluate(RunConfig.from_config(config), workdir)["complete"]

    def records(path):
        kept = [r for r in read_metrics(path) if "loss" in r]
        timings = ("tokens_per_sec", "host_wait")
        return [{k: v for k, v in r.items() if k not in timings} for r in kept]

    assert [r["step"] for r in records(workdir)] == [2, 4, 6]
    assert records(workdir) == records(reference)


LATE_SIGTERM = """
import os, signal, sys
from transformer_jax.cli import train as cli
from transformer_jax.training import loop

update, train_and_evaluate = loop._Trainer.update, loop._train_and_evaluate
def update_then_sigterm(self, step):  # the launcher's SIGTERM to this task, at step {stop_at}
    update(self, step)
    if step == {stop_at}:
        os.kill(os.getpid(), signal.SIGTERM)
def train_and_evaluate_then_sigterm(*args):  # a late second SIGTERM, while the saved run
    result = train_and_evaluate(*args)       # is torn down
    os.kill(os.getpid(), signal.SIGTERM)
    return result
loop._Trainer.update = update_then_sigterm
loop._train_and_evaluate = train_and_evaluate_then_sigterm
sys.argv = ["train.py", "--config={config}", "--workdir={workdir}"]
sys.exit(cli.main())
"""


@pytest.mark.parametrize("stop_at, code", [(2, 75), (None, 0)])
def test_a_sigterm_after_the_run_is_saved_does_not_kill_train_py(prepared, tmp_path, stop_at, code):
    """What a launcher does when it signals each process of a run steps apart: the second
    SIGTERM reaches a process whose run is saved (stopped, or complete) and that is shutting
    down, its peers waiting for it. It is ignored from the moment training stops."""
    _, config_path = micro_config(tmp_path, steps=4, every=4)
    workdir = workdir_from(prepared, tmp_path / "run")
    script = LATE_SIGTERM.format(stop_at=stop_at, config=config_path, workdir=workdir)
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == code, proc.stderr[-3000:]


def test_signals_restore_the_handlers_or_give_sigterm_the_one_for_after():
    """On exit each signal gets back its handler, or SIGTERM the one given for after."""
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with Signals():
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        with Signals(sigterm_after=signal.SIG_IGN):
            pass
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)


def test_signals_give_a_handler_from_outside_python_the_default_back(monkeypatch):
    """signal.signal answers None for a handler installed outside Python: exit installs
    SIG_DFL, since None cannot be installed."""
    real = signal.signal
    answers = {signal.SIGTERM: None}

    def first_sigterm_from_outside(signum, handler):
        previous = real(signum, handler)
        return answers.pop(signum, previous)

    before = real(signal.SIGTERM, signal.SIG_IGN)
    monkeypatch.setattr(signal, "signal", first_sigterm_from_outside)
    try:
        with Signals():
            pass
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        real(signal.SIGTERM, before)


SIGTERM_IN_FINAL_EVALUATION = """
import os, signal, sys
from transformer_jax.cli import train as cli
from transformer_jax.training import loop

dev = loop.Evaluator.dev
def dev_after_a_sigterm(self, params):
    os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's, once the last step is saved
    return dev(self, params)

loop.Evaluator.dev = dev_after_a_sigterm
sys.argv = ["train.py", "--config={config}", "--workdir={workdir}", "--config.train.eval_every=0"]
sys.exit(cli.main())
"""


def test_a_sigterm_during_the_final_evaluation_lets_it_finish(tmp_path):
    """A run that ends just before its budget: the budget's SIGTERM reaches the final
    evaluation, which finishes and is saved; train.py exits 0, the run complete."""
    _, config_path = micro_config(tmp_path, steps=4, every=4)
    workdir = tmp_path / "run"
    script = SIGTERM_IN_FINAL_EVALUATION.format(config=config_path, workdir=workdir)
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "eval_loss" in read_metrics(str(workdir))[-1]


@pytest.mark.parametrize("damage", ["removed", "truncated"])
def test_corrupt_latest_checkpoint_falls_back_to_the_previous(
    prepared, tmp_path, capsys, caplog, monkeypatch, damage
):
    config, _ = micro_config(tmp_path, steps=4, every=2)
    workdir = workdir_from(prepared, tmp_path / "run")
    train_and_evaluate(RunConfig.from_config(config), workdir)
    latest = os.path.join(workdir, "checkpoints", "4", "params")
    for root, dirs, files in os.walk(latest, topdown=False):  # damage the parameters
        for name in files:
            path = os.path.join(root, name)
            if damage == "removed":
                os.remove(path)
            elif "ocdbt.process_" in root:  # the arrays' bytes; the index still names them
                os.truncate(path, 10)
        for name in dirs if damage == "removed" else []:
            os.rmdir(os.path.join(root, name))
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(u.exc_value))
    config.train.num_steps = 5
    train_and_evaluate(RunConfig.from_config(config), workdir)
    time.sleep(0.5)  # the reads orbax abandoned end, and are collected
    gc.collect()
    out = capsys.readouterr().out
    assert "checkpoint 4 in" in out and "is unreadable" in out and "moved it to" in out
    assert "resuming from the checkpoint at step 2" in out
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "4.unreadable"))
    assert not unraisable and "never retrieved" not in caplog.text, (unraisable, caplog.text)


def test_non_finite_parameters_are_never_saved(prepared, tmp_path):
    config, _ = micro_config(tmp_path, steps=8, every=1)
    config.train.learning_rate_scale = 1e30  # the first update blows the weights up
    workdir = workdir_from(prepared, tmp_path / "run")
    with pytest.raises(FloatingPointError, match=r"at step \d|after step \d") as info:
        train_and_evaluate(RunConfig.from_config(config), workdir)
    saved = checkpoints.list_steps(workdir)
    for step in saved:
        params = checkpoints.load_run(workdir, step)[1]
        assert all(np.isfinite(x).all() for x in jax.tree.leaves(params)), step
    newest = f"newest finite checkpoint is step {saved[-1]}" if saved else "No finite checkpoint"
    assert newest in str(info.value)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("train.num_steps", -5, "train.num_steps must be a positive integer, got -5"),
        ("train.parallel", "gpus", "train.parallel must be one of"),
        ("train.label_smoothing", 1.5, "train.label_smoothing"),
        ("train.weight_decay", -0.1, r"train.weight_decay must be a number >= 0, got -0.1"),
        ("model.word_dropout_rate", 1.0, r"word_dropout_rate must be in \[0, 1\)"),
        ("train.cooldown_steps", 500, "train.cooldown_steps=500 must be at most train.num_steps"),
        ("data.source", "csv", "data.source must be one of"),
        ("data.bpe_dropout", 1.0, r"data.bpe_dropout must be in \[0, 1\), got 1.0"),
        ("data.text_dir", "", "data.text_dir must be set"),
        ("data.max_len", 100, "data.max_len=100 must be <= model.max_len"),
        ("model.d_model", 31, "d_model=31 must be divisible by num_heads"),
    ],
)
def test_bad_config_values_name_the_field(tmp_path, field, value, message):
    config, _ = micro_config(tmp_path)
    if field == "data.text_dir":
        config.data.source = "text"
    section, name = field.split(".")
    config[section][name] = value
    with pytest.raises(ValueError, match=message):
        validate_config(RunConfig.from_config(config))


def test_a_run_refused_for_missing_data_leaves_no_workdir(tmp_path):
    """No data_cache/, no workdir.lock, no workdir: as if the run had not started."""
    config, _ = micro_config(tmp_path)
    (tmp_path / "text").mkdir()
    config.data.update(source="text", text_dir=str(tmp_path / "text"))
    config.data.update(src_lang="en", tgt_lang="de")
    workdir = tmp_path / "run"
    with pytest.raises(ValueError, match=r"missing text file .*train\.en"):
        train_and_evaluate(RunConfig.from_config(config), str(workdir))
    assert not workdir.exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--config.train.parallel=tpu"], "train.parallel must be one of"),
        (["--config.model.platform=metal"], "model.platform must be one of"),
        (["--config.model.platform=gpu"], "model.platform='gpu' but JAX runs on 'cpu'"),
        (["--config.model.platform=tpu"], "model.platform='tpu' but JAX runs on 'cpu'"),
        (
            ["--config.model.attention_impl=cudnn", "--config.model.dtype=bfloat16"],
            "model.attention_impl='cudnn' needs a GPU",
        ),
        (["--config.model.vocab_size=2000000000"], "parameters (model.vocab_size=2000000000"),
        (["--config.model.vocab_size=3"], "model.vocab_size must be an integer >= 260"),
        (  # a bool | None field parses as a bool
            ["--config.model.final_norm=True", "--config.model.layer_norm_eps=0"],
            "layer_norm_eps must be a number > 0",
        ),
    ],
)
def test_train_py_prints_bad_config_without_traceback(tmp_path, overrides, message):
    _, config_path = micro_config(tmp_path)
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "train.py"),
            f"--config={config_path}",
            f"--workdir={tmp_path / 'run'}",
            *overrides,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and message in line
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("when", ["while train.py imports", "once the workdir exists"])
def test_a_sigterm_during_start_up_exits_75(tmp_path, when):
    _, config_path = micro_config(tmp_path, steps=100000, every=100000)
    workdir = tmp_path / "run"
    proc = run_train(config_path, workdir, wait=False)
    if when == "once the workdir exists":
        wait_for(workdir.exists, proc)
    else:
        time.sleep(1)  # importing JAX takes longer
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, out
    assert "Traceback" not in out and "terminate called" not in out


def test_tfds_source_end_to_end_with_mock_data(tmp_path, monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    # mock_data stands in for the download: no probe of the network for an unprepared dataset
    monkeypatch.setattr(sources, "_unreachable", lambda url, timeout: None)
    config, _ = micro_config(tmp_path, steps=2, every=2)
    config.data.update(
        source="tfds",
        tfds_name="wmt14_translate/de-en",
        src_lang="en",
        tgt_lang="de",
        max_len=64,
        tokenizer_train_sentences=200,
    )
    config.train.update(final_test=True, test_sentences=2, samples=1)
    config.decode.update(beam_size=1)
    with tfds.testing.mock_data(num_examples=20):
        result = train_and_evaluate(RunConfig.from_config(config), str(tmp_path / "run"))
    assert result["complete"] and np.isfinite(result["eval_loss"])
    assert np.isfinite(result["test_bleu"])
