"""Each benchmark script runs end to end on a tiny setting (``--smoke``); no speed assertions.

Checks of the scripts' own machinery (HLO parsing, MFU arithmetic, settings) are marked
``benchmark_internals`` and run with ``python -m pytest -m benchmark_internals``.
"""

import ast
import dataclasses
import glob
import importlib.util
import json
import os
import random
import subprocess
import sys
import tomllib

import jax
import numpy as np
import pytest
from conftest import ROOT

from transformer_jax.aot import programs
from transformer_jax.aot.gpus import device_gpu
from transformer_jax.data import prepared
from transformer_jax.training.schema import RunConfig

BENCHMARKS = os.path.join(str(ROOT), "benchmarks")


@pytest.fixture(autouse=True)
def _restore_xla_flags(monkeypatch):
    """train_throughput adds train.py's XLA flag to the environment; keep it to the test."""
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


def _script(name: str):
    """Import ``benchmarks/{name}.py`` once (the scripts import their helpers: ``_common``, ...)."""
    module_name = f"benchmark_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    if BENCHMARKS not in sys.path:
        sys.path.insert(0, BENCHMARKS)
    spec = importlib.util.spec_from_file_location(module_name, f"{BENCHMARKS}/{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up while defining
    spec.loader.exec_module(module)
    return module


def test_benchmark_modules_and_functions_stay_small():
    """No module in benchmarks/ over 400 lines, no function over 80 (decorators excluded)."""
    too_long = []
    for path in sorted(glob.glob(f"{BENCHMARKS}/*.py")):
        with open(path) as f:
            text = f.read()
        name = os.path.basename(path)
        if (lines := len(text.splitlines())) > 400:
            too_long.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if (lines := node.end_lineno - node.lineno + 1) > 80:
                    too_long.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    assert not too_long


def test_train_throughput_smoke(tmp_path):
    out = tmp_path / "train.json"
    payload = _script("train_throughput").main(["--smoke", "--json", str(out)])
    (row,) = payload["results"]
    assert row["timed_steps"] == 1 and row["flops_per_step"] > 0
    assert row["tgt_tokens_per_s"]["median"] > 0
    assert json.loads(out.read_text())["results"][0]["config"] == "tiny"


@pytest.mark.slow  # starts a PyTorch process
def test_train_throughput_vs_torch_smoke():
    pytest.importorskip("torch")
    payload = _script("train_throughput").main(["--smoke", "--vs-torch"])
    jax_row, torch_row = payload["results"]
    assert torch_row["variant"] == "torch" and torch_row["speed_vs_first"] > 0


@pytest.mark.benchmark_internals
def test_train_throughput_bf16_rows_use_the_bf16_ceiling():
    variants = "default,bf16-matmul,bf16"
    payload = _script("train_throughput").main(["--smoke", "--variants", variants])
    rows = {row["variant"]: row for row in payload["results"]}
    assert rows["default"]["matmul_precision"] == "float32"
    assert rows["bf16-matmul"]["matmul_precision"] == "bfloat16"
    assert rows["bf16"]["matmul_precision"] == "bfloat16"  # dtype=bfloat16: bf16 operands too
    ceilings = payload["matmul_ceiling_gflops"]
    assert set(ceilings) == {"float32", "bfloat16"}
    for row in rows.values():
        expected = row["gflops_per_s"] / ceilings[row["matmul_precision"]]
        assert abs(row["mfu"] - expected) <= 1e-9 * expected


def test_train_throughput_rejects_unknown_config():
    with pytest.raises(ValueError, match="--configs"):
        _script("train_throughput").main(["--configs", "huge"])


@pytest.mark.benchmark_internals
def test_train_throughput_mfu_against_a_datasheet_peak():
    payload = _script("train_throughput").main(["--smoke", "--peak-tflops", "0.5"])
    (row,) = payload["results"]
    assert payload["peak_tflops"] == 0.5
    assert abs(row["mfu_vs_peak"] - row["gflops_per_s"] / 500) <= 1e-12
    with pytest.raises(ValueError, match="--peak-tflops"):
        _script("train_throughput").main(["--smoke", "--peak-tflops", "0"])


@pytest.mark.benchmark_internals
def test_train_throughput_gpu_setting_is_the_papers_batch():
    setting = _script("train_throughput").SETTINGS["base-25k"]
    for length in (setting.src_len, setting.tgt_len):  # §5.1: ~25,000 tokens on each side
        assert 24_500 <= setting.batch * length <= 25_500
    assert setting.model == {"vocab_size": 32000}  # otherwise TransformerConfig(): base


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the refusal off a GPU")
def test_train_throughput_cudnn_variant_needs_a_gpu():
    with pytest.raises(ValueError, match="'bf16-cudnn' .*needs a GPU"):
        _script("train_throughput").main(["--smoke", "--variants", "default,bf16-cudnn"])


def test_train_throughput_kernels_ab_smoke():
    """``--kernels xla,cpu``: each variant with each kernel set, one row each."""
    payload = _script("train_throughput").main(["--smoke", "--kernels", "xla,cpu"])
    assert [r["variant"] for r in payload["results"]] == ["default [xla]", "default [cpu]"]
    with pytest.raises(ValueError, match="--kernels: 'fast'"):
        _script("train_throughput").main(["--smoke", "--kernels", "fast"])


def test_decode_throughput_smoke():
    payload = _script("decode_throughput").main(["--smoke"])
    methods = [r["method"] for r in payload["results"]]
    assert methods == [
        "greedy (cached)",
        "greedy (log-softmax)",
        "greedy (uncached)",
        "beam-2 (cached)",
    ]
    # The EOS logit is suppressed, so every sentence emits all its tokens.
    assert all(r["output_tokens"] == 2 * 4 for r in payload["results"])
    (ratios,) = payload["ratios"]
    assert ratios["greedy_cached_uncached_token_agreement"] == 1.0
    assert ratios["log_softmax_greedy_token_agreement"] == 1.0


def test_remat_memory_smoke():
    payload = _script("remat_memory").main(["--smoke", "--scan"])
    rows = {row["remat"]: row for row in payload["rows"]}
    assert set(rows) == {"none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable"}
    assert rows["full"]["temp_mib"] < rows["none"]["temp_mib"]  # scanned: recomputed


def test_attention_smoke():
    payload = _script("attention").main(["--smoke"])
    rows = payload["results"]
    assert [(r["n"], r["impl"]) for r in rows] == [
        (16, "reference"),
        (16, "fused"),
        (32, "reference"),
        (32, "fused"),
    ]
    assert all(r["forward_temp_bytes"] > 0 for r in rows)


def _write_corpus(directory, splits=("train", "val", "test_2016_flickr")):
    words = ["a", "dog", "cat", "runs", "sits", "on", "the", "red", "green", "grass"]
    german = ["ein", "hund", "katze", "rennt", "sitzt", "auf", "dem", "roten", "grünen", "gras"]
    for split in splits:
        lines = range(60 if split == "train" else 4)
        for lang, vocab in (("en", words), ("de", german)):
            text = "\n".join(" ".join(vocab[(i + j) % 10] for j in range(3 + i % 4)) for i in lines)
            (directory / f"{split}.{lang}").write_text(text + "\n", encoding="utf-8")


@pytest.mark.slow  # a train.py process: tokenizer, two steps, checkpoints, decoding (~30 s)
def test_quality_smoke(tmp_path):
    data = tmp_path / "text"
    data.mkdir()
    _write_corpus(data)
    args = ["--smoke", "--minutes", "10", "--data-dir", str(data), "--beams", "1", "--average", "2"]
    payload = _script("quality").main([*args, "--workdir", str(tmp_path / "run")])
    assert payload["step"] == 2 and not payload["stopped_by_budget"]
    assert [(r["checkpoint"], r["beam"]) for r in payload["test"]] == [
        ("latest", 1),
        ("averaged", 1),
    ]
    assert all(r["sentences"] == 4 and 0.0 <= r["bleu"] <= 100.0 for r in payload["test"])
    assert all(
        r["dev_perplexity"] > 1.0 and 0.0 <= r["dev_accuracy"] <= 1.0 for r in payload["test"]
    )
    assert payload["loss_curve"] and "loss" in payload["loss_curve"][0]
    # the run that finished within its budget left the scoring to quality.py
    assert "on test" not in (tmp_path / "run" / "train.log").read_text()


@pytest.mark.benchmark_internals
def test_quality_dev_metrics_equal_the_training_loops_final_evaluation(tmp_path):
    """What quality.py reports for a checkpoint on the dev split is what train.py measured."""
    scores = _script("_quality_scores")  # _common puts the repository root on sys.path
    from configs.tiny import get_config
    from transformer_jax.inference.runs import load
    from transformer_jax.training.loop import train_and_evaluate

    config = get_config()
    config.model.update(
        vocab_size=300, d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1, num_decoder_layers=1
    )
    config.data.update(tokens_per_batch=256, tokenizer_train_sentences=2000)
    config.train.update(num_steps=3, warmup_steps=2, eval_sentences=0, final_test=False)
    result = train_and_evaluate(RunConfig.from_config(config), str(tmp_path))
    dev = scores.dev_metrics(*load(str(tmp_path), "latest"), str(tmp_path))
    assert result["complete"] and result["eval_loss"] > 0
    for name in ("loss", "perplexity", "accuracy"):
        assert dev[name] == pytest.approx(result[f"eval_{name}"], rel=1e-5)


# The baseline's output (../shared/bench/multi30k_torch.py): its log() lines, HH:MM:SS first.
TORCH_OUTPUT = """\
19:02:11 args {'data_dir': 'data', 'work_dir': 'w', 'minutes': 30.0, 'warmup': 200}
19:02:31 tokenizer + encoding 19.8s; vocab 8000; train 29000 pairs, 412345 src / 423456 tgt \
tokens (incl. EOS); max len src 43 tgt 47
19:02:31 params 9,421,056 (embedding 2,048,000)
19:02:35 first step done at 3.9s; 118 batches/epoch
19:07:35 step 86 epoch 0.73 train_time 300s lr 2.13e-03 | train ls_loss 6.123 nll 5.789 | val \
ls_loss 5.012 nll 4.567 ppl 96.25 | tgt tok/s 1234 (cumulative 1234) s/step 3.49 [val took 8.1s]
19:32:40 TRAINING DONE: 881 steps, 7.47 epochs, 1801s training, 3162345 target tokens, 1756 tgt \
tok/s; final val ls_loss 2.345 nll 1.678
19:33:40 TEST2016 greedy: BLEU = 34.12 66.1/41.0/27.5/18.9 (BP = 1.000 ratio = 1.012 hyp_len = \
12456 ref_len = 12310)  [nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0]  decode 21.4s
19:36:40 TEST2016 beam4: BLEU = 35.40 67.2/42.3/28.6/19.8 (BP = 0.998 ratio = 0.998 hyp_len = \
12290 ref_len = 12310)  [nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0]  decode 95.2s
--- sample 0
  SRC: Two young, White males are outside near many bushes.
  REF: Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.
  GREEDY: Zwei junge weiße Männer sind draußen in der Nähe vieler Büsche.
  BEAM4 : Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.
"""

# A stand-in for the baseline: records its arguments, prints the real script's output.
FAKE_TORCH = """\
import json, os, sys
work_dir = sys.argv[sys.argv.index("--work_dir") + 1]
os.makedirs(work_dir, exist_ok=True)
with open(os.path.join(work_dir, "argv.json"), "w") as f:
    json.dump(sys.argv[1:], f)
print({output!r})
"""


def test_quality_parses_the_baselines_output():
    baseline = _script("_quality_baseline")
    result = baseline.parse_torch_output(TORCH_OUTPUT)
    assert result["bleu"] == {1: 34.12, 4: 35.40}
    assert result["signature"] == "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
    assert (result["steps"], result["epochs"], result["train_s"]) == (881, 7.47, 1801)
    assert (result["target_tokens"], result["target_tokens_per_sec"]) == (3162345, 1756)
    assert (result["dev_cross_entropy"], result["dev_nll"]) == (2.345, 1.678)
    assert (result["vocab_size"], result["train_pairs"]) == (8000, 29000)
    with pytest.raises(ValueError, match="TRAINING DONE"):
        baseline.parse_torch_output(TORCH_OUTPUT.replace("TRAINING DONE", "training done"))
    with pytest.raises(ValueError, match="TEST2016"):
        baseline.parse_torch_output(TORCH_OUTPUT.split("19:33:40")[0])


def test_quality_counts_the_batches_of_a_packed_run(tmp_path):
    from transformer_jax.data import pipeline, preparation
    from transformer_jax.data.batching import TrainIterator
    from transformer_jax.training.schema import RunConfig, default_config

    config = default_config()
    config.data.update(source="synthetic", packing=True, tokens_per_batch=1024, max_len=64)
    config.data.update(train_split="validation", tokenizer_train_sentences=2000)
    config = RunConfig.from_config(config)
    (tmp_path / "config.json").write_text(config.to_json())
    tokenizer = preparation.get_tokenizer(config.data, str(tmp_path), 400)
    encoded = pipeline.encoded_split(config.data, "validation", tokenizer, str(tmp_path))
    batcher = pipeline.make_batcher(config.data, encoded, 2)
    expected = len(TrainIterator(batcher, config.data.seed).epoch_plan(0))
    assert (
        _script("_quality_scores").batches_per_epoch(
            str(tmp_path), {"batches_per_epoch": None, "devices": 2}
        )
        == expected
        > 10
    )


def test_quality_reads_the_runs_files(tmp_path):
    from transformer_jax.training.logs import METRICS_FILE, write_run_info

    write_run_info(str(tmp_path), {"batches_per_epoch": 50, "target_tokens_per_epoch": 20_000})
    records = [{"step": s, "loss": 1.0, "tokens_per_sec": 100.0 * s} for s in (10, 20, 30, 40)]
    (tmp_path / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = _script("_quality_scores").run_summary(str(tmp_path), step=75, train_wall_s=60.0)
    assert summary["run_info"]["batches_per_epoch"] == 50 and summary["epochs"] == 1.5
    assert summary["target_tokens_per_sec"] == 1.5 * 20_000 / 60.0
    assert summary["median_tokens_per_sec"] == 3000.0  # of the records after the first


def test_quality_clock_starts_with_the_process_or_when_the_loop_writes_its_file(tmp_path):
    """``--clock loop``: the budget counts from when ``run_info.json`` appears."""
    budget = _script("_quality_budget")
    child = (  # writes argv[1] after argv[2] seconds; on SIGTERM exits as train.py does
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *_: sys.exit({budget.EXIT_PREEMPTED}))\n"
        "time.sleep(float(sys.argv[2]))\n"
        "open(sys.argv[1], 'w').close()\n"
        "time.sleep(60)\n"
    )
    started = tmp_path / "started"
    command = [sys.executable, "-c", child, str(started)]
    loop = budget.train_within_budget(
        [*command, "1"], [0.01], str(tmp_path / "a.log"), str(started)
    )
    assert loop["stopped_by_budget"] and loop["setup_s"] >= 1.0
    assert 0.6 <= loop["train_wall_s"] < 5.0
    started.unlink()
    process = budget.train_within_budget([*command, "30"], [0.04], str(tmp_path / "b.log"))
    assert process["stopped_by_budget"] and process["setup_s"] == 0.0
    assert 2.4 <= process["train_wall_s"] < 6.0 and not started.exists()  # stopped before it


def test_quality_side_by_side_runs_have_their_own_clocks_and_cores(tmp_path):
    """``--ensemble``: each process starts its clock when its own file appears, gets the
    signal at its own mark, and runs on the cores it was given."""
    budget = _script("_quality_budget")
    child = (  # records its cores, writes argv[1] after argv[2] s, exits as train.py on SIGTERM
        "import os, signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *_: sys.exit({budget.EXIT_PREEMPTED}))\n"
        "print(sorted(os.sched_getaffinity(0)), flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n"
        "open(sys.argv[1], 'w').close()\n"
        "time.sleep(60)\n"
    )
    clocks = [str(tmp_path / "a.started"), str(tmp_path / "b.started")]
    commands = [[sys.executable, "-c", child, clocks[0], "0.2"]]
    commands += [[sys.executable, "-c", child, clocks[1], "1.5"]]
    logs = [str(tmp_path / "a.log"), str(tmp_path / "b.log")]
    cores = sorted(os.sched_getaffinity(0))
    cpus = [{cores[0]}, {cores[-1]}]
    first, second = budget.train_side_by_side(commands, [0.01], logs, clocks, cpus)
    assert first["stopped_by_budget"] and second["stopped_by_budget"]
    assert second["setup_s"] - first["setup_s"] >= 1.0  # each clock began with its own file
    assert all(0.6 <= t["train_wall_s"] < 5.0 for t in (first, second))
    for log, cpu in zip(logs, cpus, strict=True):
        assert open(log).read().splitlines()[0] == str(sorted(cpu))


def test_quality_ensemble_members_share_the_cores_and_the_headline_is_the_ensemble(
    monkeypatch,
):
    budget, vs_torch = _script("_quality_budget"), _script("_quality_baseline")
    monkeypatch.setattr(budget.os, "sched_getaffinity", lambda _: {0, 1, 2, 3, 5})
    assert budget.member_cpus(2) == [{0, 1}, {2, 3}]
    with pytest.raises(ValueError, match="--ensemble 6 needs a core per model"):
        budget.member_cpus(6)
    row = lambda model, checkpoint, score: {  # noqa: E731
        "model": model, "checkpoint": checkpoint, "beam": 4, "bleu": score, "dev_nll": 1.5,
        "dev_cross_entropy": 2.5,
    }  # fmt: skip
    project = {
        "test": [row("ensemble", "latest", 41.0), row("member 0", "latest", 39.0)],
        "averaged_steps": [],
        "step": 9000,
        "epochs": 80.0,
        "train_wall_s": 3600.0,
        "target_tokens_per_sec": 9000.0,
    }
    baseline = {"bleu": {4: 37.0}, "steps": 1700, "epochs": 14.0, "train_s": 3600}
    baseline.update(target_tokens_per_sec=5000, dev_nll=1.9, dev_cross_entropy=2.9)
    rows = {r["measure"]: r for r in vs_torch.compare(project, baseline)}
    assert rows["test BLEU, beam 4"]["project"] == 41.0
    assert rows["test BLEU, beam 4"]["difference"] == 4.0


def test_quality_ensemble_dev_metrics_are_the_members_mean_at_that_checkpoint():
    scores = _script("_quality_scores")
    row = lambda model, checkpoint, beam, nll: {  # noqa: E731
        "model": model, "checkpoint": checkpoint, "beam": beam, "bleu": 30.0, "dev_nll": nll,
        "dev_accuracy": nll / 10,
    }  # fmt: skip
    rows = [
        row("member 0", "snapshots/100", 4, 9.0),
        row("member 0", "latest", 1, 1.0),
        row("member 0", "latest", 4, 1.0),
        row("member 0", "averaged", 4, 2.0),
        row("member 1", "latest", 1, 3.0),
        row("member 1", "latest", 4, 3.0),
        row("member 1", "averaged", 4, 5.0),
    ]
    assert scores.members_dev(rows, "latest") == pytest.approx({"nll": 2.0, "accuracy": 0.2})
    assert scores.members_dev(rows, "averaged") == pytest.approx({"nll": 3.5, "accuracy": 0.35})


def test_quality_vs_torch_refuses_in_one_line_before_anything_runs(tmp_path, monkeypatch):
    quality = _script("quality")
    data, run = tmp_path / "text", tmp_path / "run"
    data.mkdir()
    args = ["--minutes", "1", "--vs-torch", "--data-dir", str(data), "--workdir", str(run)]
    with pytest.raises(ValueError, match="--vs-torch needs --torch-script PATH"):
        quality.main(args)
    missing = str(tmp_path / "absent.py")
    cli = subprocess.run(
        [sys.executable, f"{BENCHMARKS}/quality.py", *args, "--torch-script", missing],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 1 and cli.stdout == ""
    assert (
        cli.stderr == f"quality.py: --vs-torch: no baseline script at {missing} (--torch-script)\n"
    )
    script = tmp_path / "baseline.py"
    script.write_text("")
    args += ["--torch-script", str(script)]
    monkeypatch.setattr(quality, "torch_installed", lambda: False)
    with pytest.raises(ValueError, match="torch is not installed"):
        quality.main(args)
    monkeypatch.setattr(quality, "torch_installed", lambda: True)
    with pytest.raises(ValueError, match="--tgt-lang fr"):
        quality.main([*args, "--tgt-lang", "fr"])
    with pytest.raises(ValueError, match="one budget"):
        quality.main([*args, "--minutes", "30,60"])
    assert not run.exists()


@pytest.mark.slow  # a train.py process: tokenizer, two steps, checkpoints, decoding (~30 s)
def test_quality_vs_torch_with_a_stand_in_baseline(tmp_path, monkeypatch, capsys):
    quality = _script("quality")
    monkeypatch.setattr(quality, "torch_installed", lambda: True)  # the stand-in needs none
    script = tmp_path / "baseline.py"
    script.write_text(FAKE_TORCH.format(output=TORCH_OUTPUT))
    data, run = tmp_path / "text", tmp_path / "run"
    data.mkdir()
    _write_corpus(data)
    args = ["--smoke", "--minutes", "10", "--data-dir", str(data), "--beams", "1", "--vs-torch"]
    args += ["--average", "2"]
    payload = quality.main([*args, "--torch-script", str(script), "--workdir", str(run)])
    argv = json.loads((run / "torch_baseline" / "argv.json").read_text())
    assert argv == [
        *("--minutes", "10", "--warmup", "200", "--lr_scale", "0.5"),
        *("--data_dir", str(data), "--work_dir", str(run / "torch_baseline")),
    ]
    assert payload["clock"] == "loop" and payload["setup_s"] > 0  # tokenizer not counted
    assert payload["run_info"]["train_pairs"] == 60 and payload["step"] == 2
    rows = {r["measure"]: r for r in payload["vs_torch"]["comparison"]}
    assert list(rows) == [
        "test BLEU, greedy",
        "test BLEU, greedy, averaged",
        "steps",
        "epochs",
        "seconds counted",
        "target tokens/s",
        "dev NLL",
        "dev cross-entropy",
    ]
    assert rows["steps"] == {**rows["steps"], "project": 2, "baseline": 881, "difference": -879}
    greedy = rows["test BLEU, greedy"]
    assert greedy["baseline"] == 34.12 and greedy["project"] == payload["test"][0]["bleu"]
    averaged = rows["test BLEU, greedy, averaged"]
    assert averaged["meaning"] == "sacreBLEU 13a, mean of the last 2 checkpoints"
    assert averaged["project"] == payload["test"][-1]["bleu"]
    assert payload["averaged_steps"] == [1, 2]
    assert rows["dev NLL"]["project"] == payload["test"][0]["dev_nll"]
    assert payload["vs_torch"]["baseline"]["bleu"] == {1: 34.12, 4: 35.40}
    assert "| torch baseline |" in capsys.readouterr().out


def test_quality_budget_marks():
    budget = _script("_quality_budget")
    assert budget.parse_marks("30,60") == [30.0, 60.0] and budget.parse_marks("0.5") == [0.5]
    for bad in ("0", "60,30", "30,30", "thirty"):
        with pytest.raises(ValueError, match="--minutes"):
            budget.parse_marks(bad)


def test_quality_ensemble_refuses_several_budgets(tmp_path):
    data = tmp_path / "text"
    data.mkdir()
    args = ["--data-dir", str(data), "--workdir", str(tmp_path / "run")]
    for bad in (["--ensemble", "2", "--minutes", "30,60"], ["--ensemble", "0", "--minutes", "5"]):
        with pytest.raises(ValueError, match="--ensemble takes N >= 1 and one budget"):
            _script("quality").main([*args, *bad])
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # two train.py processes side by side, two steps each, decoding (~60 s)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="an ensemble needs two cores")
def test_quality_ensemble_smoke(tmp_path):
    data = tmp_path / "text"
    data.mkdir()
    _write_corpus(data)
    args = ["--smoke", "--minutes", "10", "--data-dir", str(data), "--beams", "1", "--average", "2"]
    payload = _script("quality").main([*args, "--ensemble", "2", "--workdir", str(tmp_path / "r")])
    members = payload["members"]
    assert [m["step"] for m in members] == [2, 2] and payload["step"] == 4
    seeds = [
        json.loads((tmp_path / "r" / f"member{i}" / "config.json").read_text()) for i in (0, 1)
    ]
    assert [(c["train"]["seed"], c["data"]["seed"]) for c in seeds] == [(0, 0), (1, 1)]
    assert [(r["model"], r["checkpoint"]) for r in payload["test"]] == [
        ("ensemble", "latest"),
        ("ensemble", "averaged"),
        ("member 0", "latest"),
        ("member 0", "averaged"),
        ("member 1", "latest"),
        ("member 1", "averaged"),
    ]
    ensemble, alone = payload["test"][0], payload["test"][2::2]
    assert ensemble["step"] == 4 and 0.0 <= ensemble["bleu"] <= 100.0
    assert ensemble["dev_nll"] == pytest.approx(sum(r["dev_nll"] for r in alone) / 2)


def test_quality_reads_multi30k_from_the_clone_by_default(tmp_path, monkeypatch):
    quality = _script("quality")
    assert quality.DEFAULT_DATA == os.path.join(str(ROOT), "data", "multi30k")
    monkeypatch.setattr(quality, "DEFAULT_DATA", str(tmp_path / "absent"))
    command = "python -m transformer_jax.download multi30k --dest data/multi30k"
    with pytest.raises(ValueError, match=f"not a directory .*{command}"):
        quality.main(["--minutes", "1", "--workdir", str(tmp_path / "run")])


def test_quality_refuses_a_used_workdir(tmp_path):
    data = tmp_path / "text"
    data.mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="--workdir"):
        _script("quality").main(
            ["--minutes", "1", "--data-dir", str(data), "--workdir", str(tmp_path / "run")]
        )


def _tiny_step(variant: str, layers: int = 1):
    throughput = _script("train_throughput")
    setting = throughput.SETTINGS["tiny"]
    model = dict(setting.model, num_encoder_layers=layers, num_decoder_layers=layers)
    return throughput.JaxStep(dataclasses.replace(setting, model=model), variant)


@pytest.mark.benchmark_internals
@pytest.mark.parametrize("variant", ["default", "bf16-matmul"])
def test_dot_floor_finds_every_product_of_the_step(variant):
    """The products read from the compiled step do the analytic FLOPs of costs.py."""
    from transformer_jax.analysis.costs import training_flops

    step = _tiny_step(variant)
    found = _script("dot_floor").dots(step.optimized_hlo())
    setting = _script("train_throughput").SETTINGS["tiny"]
    expected = training_flops(step.config, setting.src_len, setting.tgt_len, setting.batch)
    assert sum(count * dot.flops for dot, count in found.items()) == expected
    operand_type = "bfloat16" if variant == "bf16-matmul" else "float32"
    assert {dot.lhs.dtype for dot in found} == {operand_type}
    assert {dot.out_dtype for dot in found} == {"float32"}


@pytest.mark.benchmark_internals
def test_dot_floor_refuses_products_in_loops():
    with pytest.raises(ValueError, match="loop"):
        _script("dot_floor").dots(_tiny_step("scan", layers=2).optimized_hlo())


@pytest.mark.benchmark_internals
def test_dot_floor_reads_types_layouts_and_dimensions():
    hlo = "\n".join(
        [
            "HloModule m",
            "%fused (param_0: f32[64,32], param_1: bf16[8,64,16]) -> f32[32,8,16] {",
            "  %param_0 = f32[64,32]{0,1} parameter(0)",
            "  %param_1 = bf16[8,64,16]{0,2,1} parameter(1)",
            "  ROOT %dot.1 = f32[32,8,16]{2,1,0} dot(%param_0, %param_1), "
            "lhs_contracting_dims={0}, rhs_contracting_dims={1}",
            "}",
        ]
    )
    floor = _script("dot_floor")
    ((dot, count),) = floor.dots(hlo).items()
    assert count == 1 and dot.out_dtype == "float32"
    assert (dot.lhs.dtype, dot.lhs.shape, dot.lhs.order) == ("float32", (64, 32), (1, 0))
    assert (dot.rhs.dtype, dot.rhs.shape, dot.rhs.order) == ("bfloat16", (8, 64, 16), (1, 2, 0))
    assert (dot.lhs_contracting, dot.rhs_contracting) == ((0,), (1,))
    assert dot.flops == 2 * 64 * 32 * 8 * 16
    assert "stored (1, 0)" in dot.describe() and "stored (1, 2, 0)" in dot.describe()
    assert floor.time_dot(dot, repeats=1) > 0  # operands made in these layouts fit the dims


def test_train_throughput_dot_floor_smoke():
    payload = _script("train_throughput").main(["--smoke", "--dot-floor"])
    (row,) = payload["results"]
    floor = row["dot_floor"]
    assert floor["flops"] == row["flops_per_step"] and floor["seconds"] > 0
    assert floor["step_vs_floor"] == pytest.approx(row["step_s"]["median"] / floor["seconds"])
    assert "torch_step_vs_floor" not in floor  # no torch row
    assert sum(d["count"] for d in floor["dots"]) > 0


def test_every_results_record_parses_and_has_the_required_keys(capsys):
    tables = _script("tables")
    records = tables.load_records()
    assert records and all(not tables.problems(r, name) for name, r in records.items())
    assert tables.main(["--check"]) == 0
    assert f"{len(records)} records" in capsys.readouterr().out


def test_a_records_problems_are_named(tmp_path):
    tables = _script("tables")
    good = json.loads(open(f"{BENCHMARKS}/results/attention-full.json").read())
    assert tables.problems(good, "a.json") == []
    cases = {
        "b.json": ({k: v for k, v in good.items() if k != "machine"}, "no 'machine'"),
        "c.json": ({**good, "date": "6 Dec 2026"}, "not YYYY-MM-DD"),
        "d.json": ({**good, "benchmark": "nonesuch"}, "no script benchmarks/nonesuch.py"),
        "e.json": ({**good, "rows": [[1, 2]]}, "row 0 does not have 7 cells"),
        "f.json": ({**good, "current": "yes"}, "'current' is str"),
    }
    for name, (record, problem) in cases.items():
        (tmp_path / name).write_text(json.dumps(record))
        assert problem in " ".join(tables.problems(record, name))
    (tmp_path / "g.json").write_text("{")
    with pytest.raises(ValueError, match=r"b\.json: no 'machine'.*g\.json: not JSON"):
        tables.load_records(str(tmp_path))


def test_a_record_renders_as_its_caption_and_markdown_table():
    record = {
        "benchmark": "attention", "title": "t", "date": "2026-12-06", "machine": "2 cores",
        "versions": {"jax": "0.10.2", "torch": None}, "command": "python x.py", "config": None,
        "current": True, "columns": ["run", "steps", "BLEU"], "context": [],
        "rows": [["baseline", 1856, 36.5], ["project", 12345, "41.0 (+4.5)"], ["x", None, None]],
    }  # fmt: skip
    assert _script("tables").render(record) == (
        "`python x.py`; 2 cores; 2026-12-06; jax 0.10.2:\n\n"
        "| run | steps | BLEU |\n"
        "|---|---:|---|\n"
        "| baseline | 1,856 | 36.5 |\n"
        "| project | 12,345 | 41.0 (+4.5) |\n"
        "| x |  |  |"
    )


def test_the_benchmarks_readme_shows_each_current_table_within_200_lines():
    tables = _script("tables")
    with open(f"{BENCHMARKS}/README.md") as f:
        readme = f.read()
    assert len(readme.splitlines()) <= 200
    current = [r for r in tables.load_records().values() if r["current"]]
    assert {r["benchmark"] for r in current} >= {"train_throughput", "quality"}
    missing = [r["title"] for r in current if tables.render(r) not in readme]
    assert not missing, "python benchmarks/tables.py --current prints them"


@pytest.mark.slow  # two row processes on 8 simulated devices (about 90 CPU-s)
def test_gpu_check_smoke_runs_each_row_as_train_py_on_eight_devices(tmp_path):
    """pmap (base) and mesh (big, bfloat16) rows, each in its own process: timed, their
    collectives, beam search on all devices; a plan read from a file, and a plan that cannot
    be made here (no CUDA plugin) stated in one line. A row that fails is one line."""
    out = tmp_path / "gpu.json"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"train": {"total_bytes": 3 * 2**29}}))
    argv = ["--smoke", "--rows", "base,big-fast", "--json", str(out)]
    payload = _script("gpu_check").main([*argv, "--plan", f"big-fast={plan}"])
    base, big = payload["rows"]
    assert (base["parallel"], base["dtype"], big["parallel"], big["dtype"]) == (
        "pmap", "float32", "mesh", "bfloat16",
    )  # fmt: skip
    for row in (base, big):
        assert row["devices"] == 8 and row["tokens_per_s"] > 0 and row["sentences_per_s"] > 0
        assert row["decode_batch"].startswith("8 x ")  # a batch on each device
    assert set(base["collectives"]) == {"all-reduce"}
    assert set(big["collectives"]) == {"all-gather", "reduce-scatter"}
    assert big["plan_memory_gib"] == 1.5
    if not programs.plugin_available():
        assert "CUDA plugin" in base["plan_error"] and "\n" not in base["plan_error"]
    assert [r["step_ms"] for r in json.loads(out.read_text())["rows"]] == [
        base["step_ms"], big["step_ms"],
    ]  # fmt: skip

    failing = _script("gpu_check").row_spec("base", _script("gpu_check").parse(argv))
    failing["overrides"]["data.tokens_per_batch"] = 1  # fewer tokens than one sequence
    row = _script("gpu_check").run_row(failing, payload["device"], _script("gpu_check").parse(
        [*argv, "--no-plan"]))  # fmt: skip
    assert row["row"] == "base" and "data.tokens_per_batch=1" in row["error"]


def test_translate_devices_smoke():
    """One device against all local ones (here as many: the backend has started)."""
    payload = _script("translate_devices").main(["--smoke"])
    assert [r["setting"] for r in payload["rows"]][0] == "1 device"
    assert payload["same_translations"] and all(r["sentences_per_s"] > 0 for r in payload["rows"])


@pytest.mark.skipif(programs.plugin_available(), reason="checks the refusal without CUDA jax")
def test_gpu_check_off_a_gpu_is_one_line_naming_the_cuda_extra():
    with pytest.raises(SystemExit, match=r"^error: no CUDA jax .*pip install -e '\.\[cuda\]'$"):
        _script("gpu_check").main(["--rows", "base"])


def test_gpu_check_names_each_gpu_variant_by_its_device_kind():
    kinds = {
        "NVIDIA H100 80GB HBM3": ("H100 SXM", 989.4e12, "h100"),
        "NVIDIA H100 PCIe": ("H100 PCIe", 756e12, "h100"),
        "NVIDIA H100 NVL": ("H100 NVL", 835e12, "h100"),
        "NVIDIA GH200 480GB": ("GH200", 989.4e12, "h100"),
        "NVIDIA H200": ("H200 SXM", 989.4e12, "h200"),
        "NVIDIA H200 NVL": ("H200 NVL", 835e12, "h200"),
        "NVIDIA A100-SXM4-40GB": ("A100", 312e12, "a100"),
        "NVIDIA A100 80GB PCIe": ("A100", 312e12, "a100"),
    }
    for kind, (name, bf16, plan_gpu) in kinds.items():
        gpu = device_gpu(kind)
        assert (gpu.name, gpu.peak_flops("bfloat16"), gpu.plan_gpu) == (name, bf16, plan_gpu)
        assert gpu.peak_flops("bfloat16") == 2 * gpu.peak_flops("tf32") > gpu.peak_flops("float32")
    assert device_gpu("Tesla V100-SXM2-16GB") is None and device_gpu("cpu") is None


def test_the_cuda_extra_pins_the_jax_the_figures_were_made_with():
    with open(ROOT / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    (pin,) = [p for p in extras["gpu-aot"] if p.startswith("jax==")]
    assert extras["cuda"] == [f"jax[cuda12]=={pin.removeprefix('jax==')}"]


@pytest.mark.slow  # four stage processes, each importing JAX (~45 s)
def test_data_pipeline_smoke():
    payload = _script("data_pipeline").main(["--smoke"])
    (result,) = payload["results"]
    assert result["pairs"] == 2000 and result["prepared_bytes"] > 0
    for stage in ("start bucketed", "start packed"):
        assert result[stage]["batches_per_s"] > 0 and result[stage]["tgt_tokens_per_s"] > 0
    assert result["encode"]["peak_rss"] > 0 and result["gpu_steps_per_s"] > 0


@pytest.mark.slow  # two stage processes, each importing JAX and sampling epochs (~60 s)
def test_data_pipeline_boundary_smoke(tmp_path, monkeypatch):
    """Epochs 0 and 1 under BPE-dropout across the boundary, ahead and when opened, on a
    corpus in Multi30k's layout; epoch 0's files removed once epoch 1 is read."""
    rng = random.Random(0)
    words = "a dog cat runs sees the big small house tree".split()
    for name in ("train", "val", "test_2016_flickr"):
        for lang in ("en", "de"):
            lines = [" ".join(rng.choices(words, k=rng.randint(1, 12))) for _ in range(300)]
            (tmp_path / f"{name}.{lang}").write_text("\n".join(lines) + "\n")
    script = _script("data_pipeline")  # imports _data_boundary, whose corpus is this one
    monkeypatch.setattr(sys.modules["_data_boundary"], "MULTI30K", str(tmp_path))
    args = ["--smoke", "--boundary", "2000", "--step-ms", "1", "--no-ahead"]
    payload = script.main([*args, "--json", str(tmp_path / "boundary.json")])
    ahead, opened = payload["results"]
    assert ahead["ahead"] and not opened["ahead"] and ahead["pairs"] == 2000
    for result in (ahead, opened):
        assert result["batches_per_epoch"] > 0 and result["boundary_step_wait_s"] >= 0
        assert not any(name.startswith("epoch-0") for name in result["epoch_files"])
    assert len(payload["rows"]) == 2 and not _script("tables").problems(payload, "b.json")


def test_data_pipeline_writes_mapped_arrays_that_open_as_a_prepared_split(tmp_path):
    script = _script("data_pipeline")
    script.write_mapped(str(tmp_path / "mapped"), 5000, vocab=400)
    encoded, info = prepared.open_split(str(tmp_path / "mapped"))
    assert len(encoded) == info["pairs"] == 5000 and encoded.src.dtype == np.uint16
    assert 4 <= encoded.tgt.min() and encoded.src.max() <= info["max_id"] == 399
    lengths = np.diff(encoded.src_offsets)
    assert lengths.min() >= 1 and 15 < lengths.mean() < 18.5


@pytest.mark.slow  # two stage processes, each importing JAX (~25 s)
def test_data_pipeline_mapped_smoke():
    payload = _script("data_pipeline").main(["--smoke", "--mapped", "3000"])
    (result,) = payload["results"]
    assert result["pairs"] == 2000 and "encode" not in result  # --smoke's size
    for stage in ("mapped bucketed", "mapped packed"):
        assert result[stage]["batches_per_s"] > 0 and result[stage]["anon_added"] > 0
        assert result[stage]["batches_per_cpu_s"] > 0


@pytest.mark.slow  # seven stage processes, each importing JAX (~40 s)
def test_preparation_smoke():
    payload = _script("preparation").main(["--smoke"])
    stages = payload["result"]["stages"]
    assert list(stages) == [
        "spool",
        "tokenizer",
        "encode spool 1",
        "encode spool 2",
        "open",
        "encode text 1",
        "encode text 2",
    ]
    assert stages["encode spool 1"]["digest"] == stages["encode spool 2"]["digest"]
    assert stages["encode text 1"]["digest"] == stages["encode text 2"]["digest"]
    assert stages["open"]["mb_per_s"] > 0
    estimate = payload["extrapolation"]
    assert estimate["total"] == estimate["spool"] + estimate["tokenizer"] + estimate["encode"] > 0


def test_hostile_trials_sort_outcomes():
    """A refusal is one line with a failure code; a traceback, a C++ abort, a death by
    signal, a hang or exit 0 are not."""
    runs = _script("_hostile_runs")
    ran = runs.Ran
    assert runs.refused(ran(1, "loading\nerror: model.platform must be one of ...\n", 1))[0] == (
        "one-line error"
    )
    usage = "usage: translate [-h] --workdir W\ntranslate: error: --workdir is required\n"
    assert runs.refused(ran(2, usage, 1))[0] == "one-line error"
    assert runs.refused(ran(1, "Traceback (most recent call last):\nerror: x\n", 1))[0] == (
        "traceback"
    )
    assert runs.refused(ran(-6, "terminate called after throwing\n", 1))[0] == "traceback"
    assert runs.refused(ran(1, "error: a\nerror: b\n", 1))[0] == "traceback"
    assert runs.refused(ran(None, "", 300))[0] == "hang"
    assert runs.refused(ran(0, "done\n", 1))[0] == "silent wrong"


def test_hostile_trials_cover_every_group_and_count_outcomes_per_group():
    """Each of the nine groups has trials; the record counts each outcome per group; a
    process of a multi-host run stopped by SIGTERM is clean at exit 75 without an error."""
    hostile, runs = _script("hostile_trials"), _script("_hostile_runs")
    assert {group for group, _ in hostile.trials(kills=1).values()} == set(hostile.GROUPS)
    assert len(hostile.GROUPS) == 9
    rows = [["nan", "a", "OK", 1, ""], ["cli", "b", "one-line error", 1, ""]]
    rows.append(["nan", "c", "hang", 1, ""])
    columns, table = hostile.counts(rows)
    assert columns == ["outcome", "cli", "nan", "all"]
    assert table[:3] == [["OK", 0, 1, 1], ["one-line error", 1, 0, 1], ["traceback", 0, 0, 0]]
    assert table[4] == ["hang", 0, 1, 1] and len(table) == len(runs.OUTCOMES)
    ended = _script("_hostile_multihost")._ended
    assert ended(runs.Ran(75, "step 3\n", 1))[0] == "OK"
    assert ended(runs.Ran(75, "Traceback (most recent call last):\n", 1))[0] == "traceback"
    assert ended(runs.Ran(1, "error: another process of the run is lost\n", 1))[0] == (
        "one-line error"
    )


@pytest.mark.slow  # two train.py processes refused at start-up (~30 s)
def test_hostile_trials_smoke(tmp_path, capsys):
    trials = _script("hostile_trials").trials(kills=0)
    for name in ("cli stray argument", "config platform=metal", "config vocab_size=3"):
        tmp = tmp_path / name.replace(" ", "_")
        tmp.mkdir()
        outcome, detail = trials[name][1]("unused", str(tmp), 120)
        assert outcome == "one-line error" and "left the workdir" not in detail
