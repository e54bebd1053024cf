"""The plan's parts that need no compiler: the GPUs' target configs, the HLO summary, the
roofline estimate, the extra that pins the CUDA plugin, and the command's one-line errors."""

import os
import subprocess
import sys
import tomllib

import jax
import pytest
from conftest import ROOT

from transformer_jax import TransformerConfig
from transformer_jax.analysis.costs import training_flops
from transformer_jax.aot import programs
from transformer_jax.aot.gpus import GPUS, NETWORK_BANDWIDTH, get_gpu, target_config
from transformer_jax.aot.plan import (
    FIT_MARGIN,
    _could_not_fit_lines,
    _fit,
    estimate,
    fits,
    format_plan,
)
from transformer_jax.aot.programs import Compiled, hlo_summary, parse_topology
from transformer_jax.aot.xla_log import captured_stderr, read_xla_log

HLO = """
ENTRY %main (p: f32[1024,512]) -> f32[1024,512] {
  %all-reduce-start = (f32[1024,512]{1,0}, bf16[8]{0}) all-reduce-start(%p, %q), replica_groups={}
  %all-reduce-done = (f32[1024,512]{1,0}, bf16[8]{0}) all-reduce-done(%all-reduce-start)
  %all-reduce.1 = f32[] all-reduce(%x), to_apply=%add
  %all-gather.2 = s32[8,4]{1,0} all-gather(%y), dimensions={0}
  %fmha = (bf16[8,64]{1,0}, u8[0]{0}) custom-call(%a), custom_call_target="__cudnn$fmhaSoftmax"
  %opt = (f32[4]) opt-barrier(%t)
  %dot.1 = f32[64,64]{1,0} dot(%a, %b), operand_precision={highest,highest}
  %dot.2 = f32[64,64]{1,0} dot(%a, %b)
  %send = (f32[4], u32[], token[]) send(%t, %tok), channel_id=1, is_host_transfer=true
  ROOT %r = f32[1024,512]{1,0} add(%p, %p)
}
"""


def test_hlo_summary_counts_what_the_plan_reports():
    summary = hlo_summary(HLO)
    assert summary["collectives"] == {
        "all-reduce": {"count": 2, "bytes": 1024 * 512 * 4 + 8 * 2 + 4},
        "all-gather": {"count": 1, "bytes": 8 * 4 * 4},
    }
    assert summary["cudnn_attention_calls"] == 1
    assert summary["optimization_barriers"] == 1 and summary["host_transfers"] == 1
    assert summary["dots"] == 2 and summary["dots_below_highest"] == 1


@pytest.mark.parametrize("name", sorted(GPUS))
def test_each_gpus_target_config_states_its_device(name):
    gpu = get_gpu(name)
    text = target_config(gpu)
    major, minor = gpu.compute_capability
    assert f"core_count: {gpu.sm_count}\n" in text
    assert f"device_memory_size: {gpu.memory_bytes}\n" in text
    assert f"major: {major}\n    minor: {minor}\n" in text
    assert f'device_description_str: "{gpu.name}"' in text
    assert text.count("{") == text.count("}")
    assert gpu.peak_bf16 == 2 * gpu.peak_tf32 > gpu.peak_fp32 > 0
    assert gpu.peak_flops("float32") == gpu.peak_fp32


def test_the_gpus_published_figures():
    h100, a100, h200 = GPUS["h100"], GPUS["a100"], GPUS["h200"]
    assert (h100.sm_count, a100.sm_count, h200.sm_count) == (132, 108, 132)
    assert h100.compute_capability == h200.compute_capability == (9, 0)
    assert a100.compute_capability == (8, 0)
    assert h200.memory_bytes > h100.memory_bytes > 80e9 > 79e9 > 0
    assert h200.memory_bandwidth > h100.memory_bandwidth > a100.memory_bandwidth


def test_the_roofline_estimate():
    model = TransformerConfig(dtype="bfloat16")
    gpu = GPUS["h100"]
    hlo = {"collectives": {"all-reduce": {"count": 1, "bytes": 10**9}}}
    compiled = Compiled(1.0, 2 * 10**9, 0, 0, 3 * 10**9, hlo)
    one_host = estimate(gpu, model, compiled, rows=100, length=256, hosts=1)
    assert one_host["compute_s"] == training_flops(model, 256, 256, 100) / gpu.peak_bf16
    assert one_host["memory_s"] == 2 * 5e9 / gpu.memory_bandwidth
    assert one_host["comm_s"] == 2e9 / gpu.nvlink_bandwidth
    step = max(one_host["compute_s"], one_host["memory_s"]) + one_host["comm_s"]
    assert one_host["step_s"] == step and one_host["mfu"] == one_host["compute_s"] / step
    two_hosts = estimate(gpu, model, compiled, rows=100, length=256, hosts=2)
    assert two_hosts["comm_s"] == 2e9 / NETWORK_BANDWIDTH


def test_the_gpu_aot_extra_pins_the_installed_jax():
    with open(ROOT / "pyproject.toml", "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["gpu-aot"]
    version = jax.__version__
    assert f"jax=={version}" in extra
    assert f"jax-cuda12-plugin[with-cuda]=={version}" in extra
    assert f"jax-cuda12-pjrt=={version}" in extra


@pytest.mark.parametrize("topology", ["1x8", "1x0x8", "2xx8", "axbxc"])
def test_a_bad_topology_is_one_error(topology):
    with pytest.raises(ValueError, match="--topology must be three positive integers"):
        parse_topology(topology)


def plan_command(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    command = [sys.executable, "-m", "transformer_jax.plan", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)


@pytest.mark.parametrize(
    "args,code,message",
    [
        (["--topology", "1x8"], 1, "--topology must be three positive integers"),
        (["--gpu", "v100"], 2, "--gpu"),
        (["--config.model.d_modle=8"], 2, "unknown config field"),
        (["--config.data.max_len=0"], 1, "data.max_len"),
        (["--json", "/no/such/folder/plan.json"], 1, "--json: folder '/no/such/folder'"),
    ],
)
def test_plan_mistakes_are_one_line(args, code, message):
    result = plan_command("--config", "configs/base.py", *args)
    assert result.returncode == code, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.strip()]
    assert message in line, line


@pytest.mark.skipif(programs.plugin_available(), reason="the CUDA plugin is installed")
def test_plan_without_the_cuda_plugin_says_how_to_install_it():
    result = plan_command("--config", "configs/base.py", "--gpu", "h100")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: compiling for a GPU without one needs JAX's CUDA plugin of the installed "
        "jax: pip install -e '.[gpu-aot]' (README, GPUs)"
    )


def test_the_printed_plan_states_memory_fit_collectives_and_the_estimate():
    gib = 2**30
    hlo = hlo_summary(HLO)
    train = {"rows_per_device": 97, "length": 256, "compile_s": 1.0, "param_bytes": gib}
    train |= {"optimizer_bytes": 2 * gib, "argument_bytes": 3 * gib, "temp_bytes": 4 * gib}
    train |= {"total_bytes": 7 * gib, "memory_bytes": 80 * gib, "usable_bytes": 60 * gib}
    train |= {"fits": True, "hlo": hlo}
    plan = {"gpu": "NVIDIA H100 80GB HBM3", "devices": 8, "topology": "1x1x8"}
    plan |= {"parallel": "pmap", "dtype": "bfloat16", "products": "bfloat16"}
    plan |= {"attention_impl": "cudnn", "grad_accum_steps": 1, "train": train}
    plan["estimate"] = {"step_s": 0.04, "compute_s": 0.03, "memory_s": 0.01, "comm_s": 0.01}
    plan["estimate"] |= {"tokens_per_device_per_s": 1e6, "mfu": 0.75, "peak_flops": 989.4e12}
    plan["fit"] = {"max_rows_per_device": 400, "max_tokens_per_device": 102400, "margin": 0.05}
    plan["fit"] |= {"max_tokens_per_batch": 819200, "method": "fit", "compile_s": 2.0}
    plan["fit"] |= {"checked_rows": 400, "checked_total_bytes": 56 * gib}
    plan["fit"]["checked_could_not_fit"] = None
    train["could_not_fit"] = None
    text = format_plan(plan)
    assert "total 7.00 GiB of 80.00 GiB (usable 60.00 GiB): fits" in text
    assert "all-reduce x2 (2.0 MiB), all-gather x1 (0.0 MiB)" in text
    assert "with 5% of usable memory to spare" in text
    assert "data.tokens_per_batch=819200 (compiled at that size: 56.00 GiB" in text
    assert "rematerialization" not in text
    assert "estimate (roofline, not a measurement): step 40.0 ms" in text
    assert "8,000,000 tokens/s" in text and "MFU 75% of 989 TFLOP/s" in text
    plan["grad_accum_steps"] = 2
    assert "one micro-batch's gradient accumulation, per device" in format_plan(plan)


def test_plan_help_lists_its_flags():
    result = plan_command("--help")
    assert result.returncode == 0
    assert "python -m transformer_jax.plan --config" in result.stdout
    assert "--topology" in result.stdout and "--gpu: <a100|h100|h200>" in result.stdout


REMAT_LINE = (
    "W1207 12:14:21.694003    6736 hlo_rematerialization.cc:3231] Can't reduce memory use "
    "below 76.56MiB (80275535 bytes) by rematerialization; only reduced to 138.90MiB "
    "(145647120 bytes), down from 228.32MiB (239413828 bytes) originally"
)
ALARM = """E1207 12:20:01.000000    6736 slow_operation_alarm.cc:73]
********************************
[Compiling module jit_train] Very slow compile? If you want to file a bug, run with envvar \
XLA_FLAGS=--xla_dump_to=/tmp/foo and attach the results.
********************************"""


def test_xlas_log_becomes_the_plans_notes_and_the_alarm_is_dropped():
    notes, others = read_xla_log("\n".join([REMAT_LINE, ALARM, "W1207 something else"]))
    assert notes == {
        "could_not_fit": {
            "limit_bytes": 80275535,
            "reached_bytes": 145647120,
            "original_bytes": 239413828,
        },
        "slow_compile_alarms": 1,
    }
    assert others == ["W1207 something else"]
    assert read_xla_log("")[0] == {"could_not_fit": None, "slow_compile_alarms": 0}


def test_captured_stderr_takes_what_is_written_to_descriptor_2(capfd):
    with captured_stderr() as log:
        os.write(2, b"from C++\n")
    print("after", file=sys.stderr, flush=True)
    assert log == ["from C++\n"]
    assert capfd.readouterr().err == "after\n"


def compiled(total: int, could_not_fit: dict | None = None) -> Compiled:
    notes = {"could_not_fit": could_not_fit, "slow_compile_alarms": 0}
    return Compiled(1.0, total, 0, 0, 0, {}, notes)


def test_the_fit_leaves_its_margin_and_steps_down_until_its_check_fits():
    """Bytes grow by 1 per row from 100; the line through 10 and 40 rows says 10 + 845 rows
    reach the 95% target of 1000 usable bytes; the check of a step that XLA could not fit
    steps down by the margin."""
    asked = []

    def compile_rows(rows: int) -> Compiled:
        asked.append(rows)
        if rows > 700:  # XLA's rematerialization fails above 700 rows
            return compiled(100 + rows, {"limit_bytes": 800, "reached_bytes": 900})
        return compiled(100 + rows)

    fit = _fit(compile_rows, compiled(110), 10, 1000)
    assert fit["target_bytes"] == 950 and fit["margin"] == FIT_MARGIN == 0.05
    assert asked == [40, 850, 807, 766]
    assert fit["max_rows_per_device"] == 0 and fit["checked_rows"] == 766
    assert fit["checked_could_not_fit"] == {"limit_bytes": 800, "reached_bytes": 900}
    asked.clear()
    fit = _fit(
        lambda rows: compiled(100 + rows) if rows < 700 else compile_rows(rows),
        compiled(110),
        10,
        760,
    )
    assert fit["max_rows_per_device"] == fit["checked_rows"] == 622
    assert fit["checked_total_bytes"] == 722 <= fit["target_bytes"] == 722


def test_a_step_xla_could_not_fit_is_the_plans_own_line():
    could_not_fit = {"limit_bytes": 60 * 2**30, "reached_bytes": 63 * 2**30}
    lines = _could_not_fit_lines(could_not_fit, "  ")
    assert lines == [
        "  XLA's rematerialization could not bring the step under XLA's memory limit of "
        "60.00 GiB (only to 63.00 GiB): DOES NOT FIT"
    ]
    assert not fits(compiled(10, could_not_fit), 100) and fits(compiled(10), 100)
