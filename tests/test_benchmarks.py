"""Each benchmark script runs end to end on a tiny setting (``--smoke``); no speed assertions.

Checks of the scripts' own machinery (HLO parsing, MFU arithmetic, settings) are marked
``benchmark_internals`` and run with ``python -m pytest -m benchmark_internals``.
"""

import dataclasses
import importlib.util
import json
import os
import sys

import jax
import pytest
from conftest import ROOT

BENCHMARKS = os.path.join(str(ROOT), "benchmarks")


@pytest.fixture(autouse=True)
def _restore_xla_flags(monkeypatch):
    """train_throughput adds train.py's XLA flag to the environment; keep it to the test."""
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


def _script(name: str):
    """Import ``benchmarks/{name}.py`` once (the scripts import their helper ``_common``)."""
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


@pytest.mark.benchmark_internals
def test_quality_dev_metrics_equal_the_training_loops_final_evaluation(tmp_path):
    """What quality.py reports for a checkpoint on the dev split is what train.py measured."""
    quality = _script("quality")  # its helper puts the repository root (configs/) on sys.path
    from configs.tiny import get_config
    from transformer_jax.cli.common import load
    from transformer_jax.training.loop import train_and_evaluate

    config = get_config()
    config.model.update(
        vocab_size=300, d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1, num_decoder_layers=1
    )
    config.data.update(tokens_per_batch=256, tokenizer_train_sentences=2000)
    config.train.update(num_steps=3, warmup_steps=2, eval_sentences=0, final_test=False)
    result = train_and_evaluate(config, str(tmp_path))
    dev = quality.dev_metrics(*load(str(tmp_path), "latest"), str(tmp_path))
    assert result["complete"] and result["eval_loss"] > 0
    for name in ("loss", "perplexity", "accuracy"):
        assert dev[name] == pytest.approx(result[f"eval_{name}"], rel=1e-5)


def test_quality_budget_marks():
    quality = _script("quality")
    assert quality.parse_marks("30,60") == [30.0, 60.0] and quality.parse_marks("0.5") == [0.5]
    for bad in ("0", "60,30", "30,30", "thirty"):
        with pytest.raises(ValueError, match="--minutes"):
            quality.parse_marks(bad)


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
