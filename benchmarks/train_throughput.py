"""Training throughput: one full training step of the library's model, and optionally PyTorch.

A step is the library's ``train_step`` (forward with dropout, the label-smoothed
loss, backward, the Adam update with the paper's schedule) compiled with ``jax.jit`` and
the train state donated, on a batch of random full-length pairs (no padding). Reported:
first-step seconds (tracing + XLA compilation + one step), target tokens/s over the timed
steps (median and min-max), analytic matmul FLOPs per step (``transformer_jax.analysis.costs``),
achieved GFLOP/s and their fraction of a matmul ceiling measured on the same machine for
the products' operand type, float32 or bfloat16 (MFU); ``--peak-tflops`` adds the fraction
of a datasheet peak.

``--vs-torch`` also times ``torch.nn.Transformer`` of the same architecture
(``benchmarks/torch_baseline.py``) in a separate process, alternating blocks of steps
(JAX, torch, JAX, torch, ...) so that both see the same machine load.

``--variants`` times library options side by side in one process (see ``VARIANTS``),
``--kernels xla,cpu`` each of them with each kernel set (``transformer_jax.kernels``),
``--compile`` the first step of a fresh process (wall and CPU seconds), and ``--dot-floor``
every matrix product of each compiled step alone (``benchmarks/dot_floor.py``): the step's
time if nothing else cost anything, against the step and PyTorch's.

    python benchmarks/train_throughput.py                       # small
    python benchmarks/train_throughput.py --configs small,base --vs-torch --json out.json
    python benchmarks/train_throughput.py --variants default,unsafe_rbg,no-dropout,fused
    python benchmarks/train_throughput.py --variants default,bf16-matmul --kernels xla,cpu
    python benchmarks/train_throughput.py --configs small,base --vs-torch --dot-floor
    python benchmarks/train_throughput.py --configs base-25k --variants bf16-cudnn,bf16 \
        --peak-tflops 989 --steps 10   # GPU (H100/H200: 989 dense bf16 TFLOP/s)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
from _common import describe_machine, machine, matmul_ceiling, summary, write_json
from _throughput_report import print_compile, print_floors, print_results
from _throughput_settings import SETTINGS, VARIANTS, precision_of
from _throughput_workers import JaxStep, TorchWorker
from dot_floor import dot_floor


def measure(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Time one setting: each JAX variant (and torch), alternating; one row per worker."""
    from transformer_jax import TransformerConfig
    from transformer_jax.analysis.costs import training_flops

    setting = SETTINGS[name]
    workers: dict[str, Any] = {}
    first: dict[str, dict[str, float]] = {}
    precision: dict[str, str] = {}
    kernel_sets = args.kernels.split(",")
    for variant in args.variants.split(","):
        for kernels in kernel_sets:
            key = variant if kernel_sets == ["auto"] else f"{variant} [{kernels}]"
            workers[key] = JaxStep(setting, variant, kernels)  # parameters, Adam state: untimed
            wall, cpu = time.perf_counter(), time.process_time()
            workers[key].step()  # traces, compiles and runs the step
            first[key] = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
            precision[key] = precision_of(variant)
    if args.vs_torch:  # one torch process per matmul precision the variants use
        for p in dict.fromkeys(precision.values()):
            key = "torch" if p == "float32" else "torch bf16-matmul"
            wall = time.perf_counter()
            workers[key] = TorchWorker(setting, args.torch_threads, args.system_malloc, p)
            first[key] = {"wall": time.perf_counter() - wall, "cpu": float("nan")}
            precision[key] = p
    for worker in workers.values():  # warm-up, untimed
        worker.run(args.warmup)
    times: dict[str, list[float]] = {k: [] for k in workers}
    cpu: dict[str, list[float]] = {k: [] for k in workers}
    for _ in range(args.rounds):  # A B A B: every worker sees the same load
        for key, worker in workers.items():
            wall_s, cpu_s = worker.run(args.steps)
            times[key] += wall_s
            cpu[key] += cpu_s
    for worker in workers.values():
        if isinstance(worker, TorchWorker):
            worker.close()
    floors = {}
    if args.dot_floor:  # unrolled jitted steps only: products in loops would count once
        for key, worker in workers.items():
            if isinstance(worker, JaxStep) and worker.jitted and not worker.config.scan_layers:
                floors[key] = dot_floor(worker.optimized_hlo(), 1 if args.smoke else 10)

    plain = TransformerConfig(**setting.model)  # torch's model: the setting's, no variant
    tgt_tokens = setting.batch * setting.tgt_len
    rows = []
    for key, ts in times.items():
        s = summary(ts)
        config = workers[key].config if isinstance(workers[key], JaxStep) else plain
        flops = training_flops(config, setting.src_len, setting.tgt_len, setting.batch)
        rows.append(
            {
                "config": name,
                "variant": key,
                "matmul_precision": precision[key],
                "batch": f"{setting.batch}x{setting.src_len}+{setting.tgt_len}",
                "first_step_s": first[key]["wall"],
                "first_step_cpu_s": first[key]["cpu"],
                "step_s": s,
                "step_cpu_s": summary(cpu[key]),
                "tgt_tokens_per_s": {
                    "median": tgt_tokens / s["median"],
                    "min": tgt_tokens / s["max"],
                    "max": tgt_tokens / s["min"],
                },
                "timed_steps": len(ts),
                "flops_per_step": flops,
                "gflops_per_s": flops / s["median"] / 1e9,
                **({"dot_floor": floors[key]} if key in floors else {}),
            }
        )
    reference = rows[0]["step_s"]["median"]
    for row in rows:
        row["speed_vs_first"] = reference / row["step_s"]["median"]
    return rows


def add_floor_ratios(row: dict[str, Any], results: list[dict[str, Any]], ceiling: float) -> None:
    """The dot floor as MFU, the step's seconds over it, and (with a torch row of the same
    setting and operand precision) torch's: the most JAX/torch that the products allow."""
    floor = row["dot_floor"]
    floor["mfu"] = row["flops_per_step"] / floor["seconds"] / ceiling
    floor["step_vs_floor"] = row["step_s"]["median"] / floor["seconds"]
    setting = (row["config"], row["matmul_precision"])
    for other in results:
        same = (other["config"], other["matmul_precision"]) == setting
        if same and other["variant"].startswith("torch"):
            floor["torch_step_vs_floor"] = other["step_s"]["median"] / floor["seconds"]


def compile_times(args: argparse.Namespace) -> list[dict[str, Any]]:
    """First-step seconds of a training step in fresh processes (nothing compiled before):
    layers unrolled (default, and with the fused attention) and scanned (``scan_layers``).
    """
    rows = []
    for variant in ("default", "fused", "scan"):
        cmd = [sys.executable, os.path.abspath(__file__), "--configs", args.compile_config]
        cmd += ["--steps", "1", "--rounds", "1", "--warmup", "0", "--variants", variant]
        cmd += ["--no-ceiling", "--quiet-json"]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        (result,) = json.loads(out.strip().splitlines()[-1])["results"]
        rows.append(
            {
                "config": args.compile_config,
                "variant": variant,
                "layers": "nn.scan" if variant == "scan" else "unrolled",
                "first_step_s": result["first_step_s"],
                "first_step_cpu_s": result["first_step_cpu_s"],
            }
        )
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="small", help=f"comma list of {sorted(SETTINGS)}")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (A B A B)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
    parser.add_argument(
        "--variants", default="default", help=f"comma list of JAX variants {list(VARIANTS)}"
    )
    parser.add_argument(
        "--kernels",
        default="auto",
        help="comma list of kernel sets (auto, xla, cpu): each variant is timed with each",
    )
    parser.add_argument("--vs-torch", action="store_true", help="also time torch.nn.Transformer")
    parser.add_argument("--torch-threads", type=int, default=os.cpu_count())
    parser.add_argument(
        "--compile", action="store_true", help="first-step seconds in fresh processes"
    )
    parser.add_argument("--compile-config", default="small")
    parser.add_argument(
        "--dot-floor",
        action="store_true",
        help="also time each matrix product of the compiled JAX steps alone (unrolled, jit)",
    )
    parser.add_argument(
        "--system-malloc",
        action="store_true",
        help="leave glibc malloc as it is (train.py and, by default, this script and its "
        "torch process call transformer_jax.kernels.malloc.retain_freed_memory)",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        help="the accelerator's datasheet peak (dense, the rows' operand type) in TFLOP/s: "
        "adds MFU against it beside the measured ceiling's",
    )
    parser.add_argument("--no-ceiling", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quiet-json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="tiny model, one timed step")
    parser.add_argument("--json", help="write the results to this file")
    return parser


def check_args(args: argparse.Namespace) -> None:
    """ValueError for a setting, variant, kernel set or count that does not exist."""
    for name in args.configs.split(","):
        if name not in SETTINGS:
            raise ValueError(f"--configs: {name!r} is not one of {sorted(SETTINGS)}")
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            raise ValueError(f"--variants: {variant!r} is not one of {list(VARIANTS)}")
    for kernels in args.kernels.split(","):
        if kernels not in ("auto", "xla", "cpu"):
            raise ValueError(f"--kernels: {kernels!r} is not one of ['auto', 'xla', 'cpu']")
    for flag in ("steps", "rounds"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag} must be >= 1")
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        raise ValueError(f"--peak-tflops must be > 0, got {args.peak_tflops}")


def check_backend(args: argparse.Namespace, backend: str) -> None:
    """ValueError for a variant that cannot run on this JAX backend."""
    for variant in args.variants.split(","):
        cudnn = VARIANTS[variant].get("model", {}).get("attention_impl") == "cudnn"
        if cudnn and backend != "gpu":
            raise ValueError(
                f"--variants: {variant!r} (cuDNN attention) needs a GPU; the JAX backend "
                f"here is {backend!r}"
            )
        bf16_products = precision_of(variant) == "bfloat16"
        if bf16_products and "xla" in args.kernels.split(",") and backend == "cpu":
            raise ValueError(
                f"--variants: {variant!r} with --kernels xla does not train on XLA:CPU (it "
                "rejects some bfloat16 products with float32 results); use --kernels cpu"
            )


def configure_process(args: argparse.Namespace) -> None:
    """The CPU process settings train.py makes, before the first JAX computation."""
    if not args.system_malloc:
        from transformer_jax.kernels.malloc import retain_freed_memory

        retain_freed_memory()
    from transformer_jax.kernels.vectors import prefer_wide_vectors

    prefer_wide_vectors()  # as train.py does (XLA_FLAGS can set another width)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.configs, args.steps, args.rounds, args.warmup = "tiny", 1, 1, 0
    check_args(args)
    configure_process(args)
    info = machine()
    check_backend(args, info["backend"])
    size = 256 if args.smoke else 8192 if info["backend"] == "gpu" else 2048
    precisions = list(dict.fromkeys(precision_of(v) for v in args.variants.split(",")))
    ceiling = {p: float("nan") for p in precisions}
    if not args.no_ceiling:
        ceiling = {p: matmul_ceiling(size, precision=p) for p in precisions}
    results = [row for name in args.configs.split(",") for row in measure(name, args)]
    if not args.no_ceiling:  # before and after: the better one is closer to the machine's
        ceiling = {p: max(c, matmul_ceiling(size, precision=p)) for p, c in ceiling.items()}
    for row in results:  # against the ceiling of the row's own matmul precision
        row["mfu"] = row["gflops_per_s"] * 1e9 / ceiling[row["matmul_precision"]]
        if args.peak_tflops:
            row["mfu_vs_peak"] = row["gflops_per_s"] / (1e3 * args.peak_tflops)
        if "dot_floor" in row:
            add_floor_ratios(row, results, ceiling[row["matmul_precision"]])
    compiled = compile_times(args) if args.compile else []
    payload = {
        "machine": info,
        "matmul_ceiling_gflops": {p: c / 1e9 for p, c in ceiling.items()},
        "peak_tflops": args.peak_tflops,
        "results": results,
        "compile": compiled,
    }
    if args.quiet_json:
        print(json.dumps(payload))
        return payload
    print(f"machine: {describe_machine(info)}")
    print_results(results, ceiling, size, args.peak_tflops)
    if any("dot_floor" in r for r in results):
        print_floors(results)
    if compiled:
        print_compile(compiled)
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
