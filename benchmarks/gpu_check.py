"""The one script to run on a GPU machine: the paper's base and big models trained and
decoded on all its GPUs, against the GPU's peak and the plan's memory (installs nothing).

Rows: ``base`` and ``big`` as configured (float32; ``base`` runs ``pmap``, ``big`` its
``mesh``), and each in the fast GPU variant (``-fast``: bfloat16 + cuDNN attention). Each row
runs in its own process (``_gpu_check_row.py``): the program ``train.py`` would run, on all
local GPUs, for a batch of ``data.tokens_per_batch`` random tokens at ``data.max_len``; the
step (median of ``--steps`` after two warm-up steps), tokens/s (source + target), MFU
(``analysis.costs.training_flops`` over the step time and the peak of the GPU's device kind,
``aot.gpus.KINDS``), the collectives of the step, peak memory per GPU against the plan's
figure for the same config and topology (``python -m transformer_jax.plan --json``, run here
with ``JAX_PLATFORMS=cpu`` while the row runs, or ``--plan ROW=PATH``), and beam search on
every GPU. A row that fails prints one line and the next one runs; each row is printed, and
the JSON rewritten, as it finishes. The rows keep their compiled programs in the compilation
cache (``transformer_jax.compilation_cache``).

    python benchmarks/gpu_check.py [--rows base,big] [--json results/gpu_check.json]
    python benchmarks/gpu_check.py --rows base-fast,big-fast --tokens-per-batch 200000
    python benchmarks/gpu_check.py --smoke   # base- and big-shaped rows on 8 CPU devices
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
from _common import ROOT, table, write_json

from transformer_jax.aot.gpus import device_gpu  # GPU data: starts no backend here

ROW_SCRIPT = os.path.join(ROOT, "benchmarks", "_gpu_check_row.py")
FAST = {"model.dtype": "bfloat16", "model.attention_impl": "cudnn"}
ROWS = {"base": ("base", {}), "base-fast": ("base", FAST), "big": ("big", {})}
ROWS["big-fast"] = ("big", FAST)
# --smoke: the same rows, tiny; 'fast' without cuDNN (a GPU's), on 8 simulated CPU devices
SMOKE_MODEL = {"num_encoder_layers": 2, "num_decoder_layers": 2, "max_len": 16, "num_heads": 4}
SMOKE_SIZES = {"base": {"d_model": 32, "d_ff": 64}, "big": {"d_model": 64, "d_ff": 128}}
SMOKE_DATA = {"data.max_len": 16, "data.tokens_per_batch": 8 * 2 * 16, "model.vocab_size": 300}
SMOKE_DEVICES = "--xla_force_host_platform_device_count=8"
TRAIN_COLUMNS = ("row", "parallel", "devices", "dtype", "batch", "step_ms", "tokens_per_s", "mfu")
TRAIN_COLUMNS += ("peak_memory_gib", "plan_memory_gib")
DECODE_COLUMNS = ("row", "beam", "decode_batch", "decode_ms", "sentences_per_s")
CUDA_EXTRA = "pip install -e '.[cuda]'"
NAN = float("nan")


def row_spec(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """What the row process runs: the packaged config and its ``section.field`` overrides."""
    config, overrides = ROWS[name]
    overrides = dict(overrides)
    if args.tokens_per_batch:
        overrides["data.tokens_per_batch"] = args.tokens_per_batch
    if args.smoke:
        overrides.pop("model.attention_impl", None)
        sizes = SMOKE_MODEL | SMOKE_SIZES[config]
        overrides |= SMOKE_DATA | {f"model.{k}": v for k, v in sizes.items()}
    return {
        "row": name,
        "config": config,
        "overrides": overrides,
        "steps": 1 if args.smoke else args.steps,
        "repeats": 1 if args.smoke else 3,
        "decode_batch": 2 if args.smoke else args.decode_batch,
        "compilation_cache": args.compilation_cache,
    }


def environment(smoke: bool, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    if smoke:
        env |= {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"{env.get('XLA_FLAGS', '')} {SMOKE_DEVICES}"}
    env |= extra
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def last_line(text: str) -> str:
    """The error a failed process ended with: its last ``SomeError: ...`` line, else its last
    line ('' if none)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"[\w.]+(Error|Exception|Exit)\b", line)]
    return (errors or lines or [""])[-1]


def check_gpus(smoke: bool) -> dict[str, Any]:
    """The probe's devices and versions; SystemExit with one line off a GPU (but --smoke)."""
    proc = subprocess.run(
        [sys.executable, ROW_SCRIPT, "--probe"],
        env=environment(smoke),
        capture_output=True,
        text=True,
    )
    found = [x for x in proc.stdout.splitlines() if x.startswith("PROBE ")]
    if proc.returncode or not found:
        raise SystemExit(f"error: jax does not start: {last_line(proc.stderr)}")
    info = json.loads(found[-1].removeprefix("PROBE "))
    if info["backend"] != "gpu" and not smoke:
        if not info["cuda_plugin"]:
            raise SystemExit(
                f"error: no CUDA jax is installed (backend {info['backend']!r}): {CUDA_EXTRA}"
            )
        raise SystemExit(
            f"error: jax found no GPU (backend {info['backend']!r}); gpu_check measures GPUs "
            "(--smoke: the same rows on CPU)"
        )
    return info


def start_plan(spec: dict[str, Any], gpu: str, devices: int, smoke: bool, path: str) -> Any:
    """The deviceless plan of the row's config on ``1x1x{devices}`` GPUs, started."""
    argv = [sys.executable, "-m", "transformer_jax.plan", "--config", spec["config"]]
    argv += [f"--config.{k}={v}" for k, v in spec["overrides"].items()]
    argv += ["--gpu", gpu, "--topology", f"1x1x{devices}", "--nofit", "--decode_batch=0"]
    env = environment(smoke, JAX_PLATFORMS="cpu", JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1")
    env.pop("XLA_FLAGS", None)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    return subprocess.Popen([*argv, "--json", path], env=env, cwd=ROOT, **pipes)


def plan_memory(plan: Any, path: str) -> dict[str, Any]:
    """The plan's total bytes per GPU (of a finished plan process, or of a JSON file)."""
    if plan is not None:
        _, err = plan.communicate()
        if plan.returncode:
            error = last_line(err) or f"exit status {plan.returncode}"
            return {"plan_memory_gib": NAN, "plan_error": error}
    with open(path) as f:
        train = json.load(f)["train"]
    return {"plan_memory_gib": train["total_bytes"] / 2**30}


def run_row(spec: dict[str, Any], info: dict[str, Any], args: argparse.Namespace) -> dict:
    """One row in its own process, its plan beside it; ``{'row', 'error'}`` if it failed."""
    kind = device_gpu(info["device_kind"])
    path, plan = args.plans.get(spec["row"]), None
    with tempfile.TemporaryDirectory() as folder:
        if path is None and not args.no_plan and (kind or args.smoke):
            path = os.path.join(folder, "plan.json")
            gpu = kind.plan_gpu if kind else "h100"
            plan = start_plan(spec, gpu, info["devices"], args.smoke, path)
        argv = [sys.executable, ROW_SCRIPT, json.dumps(spec)]
        env = environment(args.smoke)
        try:
            proc = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=args.timeout
            )
        except subprocess.TimeoutExpired:
            proc = subprocess.CompletedProcess(argv, 124, "", f"timed out after {args.timeout} s")
        found = [x for x in proc.stdout.splitlines() if x.startswith("ROW ")]
        if proc.returncode or not found:
            if plan is not None:
                plan.kill()
                plan.wait()
            error = last_line(proc.stderr) or f"exit status {proc.returncode}"
            return {"row": spec["row"], "error": error}
        row = {"row": spec["row"]} | json.loads(found[-1].removeprefix("ROW "))
        if path:
            return row | plan_memory(plan, path)
        return row | {"plan_error": "no plan" if args.no_plan else "no plan for this GPU"}


def _known(value: float, spec: str) -> str:
    return "-" if value != value else format(value, spec)  # NaN: not known here


def describe(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"{row['row']}: FAILED: {row['error']}"
    plan = row.get("plan_error") or f"{_known(row.get('plan_memory_gib', NAN), '.2f')} GiB"
    moved = ", ".join(
        f"{k} {c['ms']:.2f} ms ({c['bus_gb_per_s']:.0f} GB/s)"
        for k, c in row["collectives"].items()
    )
    return (
        f"{row['row']}: {row['parallel']} on {row['devices']}, {row['dtype']}, {row['batch']}: "
        f"step {row['step_ms']:.1f} ms, {row['tokens_per_s']:,.0f} tokens/s, MFU "
        f"{_known(row['mfu'], '.1%')}; {moved or 'no collectives'}; peak "
        f"{_known(row['peak_memory_gib'], '.2f')} GiB per device (plan {plan}); beam "
        f"{row['beam']}: {row['sentences_per_s']:,.1f} sentences/s"
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(ROWS), help=f"of {', '.join(ROWS)}")
    parser.add_argument("--steps", type=int, default=10, help="timed train steps")
    parser.add_argument(
        "--tokens-per-batch", type=int, help="data.tokens_per_batch (default: the config's)"
    )
    parser.add_argument("--decode-batch", type=int, default=64, help="sentences per device")
    parser.add_argument("--json", help="write the results here (after each row)")
    parser.add_argument(
        "--plan",
        action="append",
        default=[],
        metavar="ROW=PATH",
        help="a row's plan (python -m transformer_jax.plan --json) instead of one made here",
    )
    parser.add_argument("--no-plan", action="store_true", help="no plan figures")
    parser.add_argument("--no-compilation-cache", dest="compilation_cache", action="store_false")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per row")
    parser.add_argument("--smoke", action="store_true", help="tiny rows on 8 CPU devices")
    args = parser.parse_args(argv)
    args.rows = args.rows.split(",")
    if unknown := [r for r in args.rows if r not in ROWS]:
        parser.error(f"--rows: unknown {unknown}; rows: {', '.join(ROWS)}")
    args.plans = dict(p.split("=", 1) for p in args.plan)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    info = check_gpus(args.smoke)
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    print(f"{info['devices']} x {info['device_kind']} ({info['backend']}); {versions}", flush=True)
    payload = {"device": info, "rows": []}
    for name in args.rows:
        row = run_row(row_spec(name, args), info, args)
        payload["rows"].append(row)
        print(describe(row), flush=True)
        write_json(args.json, payload)
    done = [r for r in payload["rows"] if "error" not in r]
    if done:
        print(table(TRAIN_COLUMNS, [[r.get(c, NAN) for c in TRAIN_COLUMNS] for r in done]))
        print(table(DECODE_COLUMNS, [[r[c] for c in DECODE_COLUMNS] for r in done]))
    return payload


if __name__ == "__main__":
    main()
