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
import dataclasses
import functools
import json
import os
import subprocess
import sys
import time
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
import numpy as np
from _common import describe_machine, machine, matmul_ceiling, summary, table, write_json
from dot_floor import dot_floor


@dataclasses.dataclass(frozen=True)
class Setting:
    """A model size and the batch it is timed on."""

    model: dict[str, Any]
    batch: int
    src_len: int
    tgt_len: int


SETTINGS = {
    "small": Setting(
        dict(
            vocab_size=8000,
            d_model=256,
            num_heads=4,
            d_ff=1024,
            num_encoder_layers=3,
            num_decoder_layers=3,
        ),
        batch=32,
        src_len=64,
        tgt_len=64,
    ),
    "members": Setting(  # configs/multi30k.py:60x2's models, one per core
        dict(
            vocab_size=8000,
            d_model=128,
            num_heads=4,
            d_ff=256,
            num_encoder_layers=4,
            num_decoder_layers=4,
        ),
        batch=64,
        src_len=64,
        tgt_len=64,
    ),
    "base": Setting(dict(vocab_size=32000), batch=16, src_len=64, tgt_len=64),  # paper base
    # the paper's batches (§5.1: ~25,000 source and 25,000 target tokens), for a GPU
    "base-25k": Setting(dict(vocab_size=32000), batch=392, src_len=64, tgt_len=64),
    "tiny": Setting(  # for the smoke test
        dict(
            vocab_size=64,
            d_model=16,
            num_heads=2,
            d_ff=32,
            num_encoder_layers=1,
            num_decoder_layers=1,
            max_len=16,
        ),
        batch=2,
        src_len=8,
        tgt_len=8,
    ),
}
LABEL_SMOOTHING = 0.1
WARMUP_STEPS = 4000
VARIANTS = {  # library options compared in one process, alternating with each other
    "default": {},  # jit, threefry dropout keys, reference attention: what train.py runs
    "fused": {"model": {"attention_impl": "fused"}},
    "scan": {"model": {"scan_layers": True}},  # nn.scan over each stack's layers
    "bf16": {"model": {"dtype": "bfloat16"}},  # bfloat16 compute, float32 parameters
    "bf16-fused": {"model": {"dtype": "bfloat16", "attention_impl": "fused"}},
    "bf16-matmul": {"model": {"matmul_precision": "bfloat16"}},  # bf16 operands, f32 rest
    "bf16-cudnn": {"model": {"dtype": "bfloat16", "attention_impl": "cudnn"}},  # GPU only
    "rbg": {"rng_impl": "rbg"},  # dropout masks from XLA's RngBitGenerator
    "unsafe_rbg": {"rng_impl": "unsafe_rbg"},
    "no-dropout": {"model": {"dropout_rate": 0.0}},  # not a training setting: RNG cost bound
    "target-5120": {"model": {"tgt_vocab_size": 5120}},  # targets: the first 5,120 pieces
    "pmap": {"parallel": "pmap"},  # the training loop's DataParallel wrappers
    "shard_map": {"parallel": "shard_map"},
}


def random_batch(
    setting: Setting, seed: int = 0, tgt_vocab: int | None = None
) -> dict[str, np.ndarray]:
    """Full-length pairs of random non-special tokens (ids 4..vocab-1, targets below
    ``tgt_vocab`` if given; no padding)."""
    rng = np.random.default_rng(seed)
    vocab = setting.model["vocab_size"]
    src = rng.integers(4, vocab, (setting.batch, setting.src_len), dtype=np.int32)
    shape = (setting.batch, setting.tgt_len + 1)
    tgt = rng.integers(4, tgt_vocab or vocab, shape, dtype=np.int32)
    return {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}


class JaxStep:
    """The library's jitted ``train_step`` on one fixed batch; ``run(n)`` times n steps.

    ``variant`` (a key of ``VARIANTS``) changes model fields, the dropout key's PRNG
    implementation (a typed key as the state's ``rng``) or the parallel wrapper;
    ``kernels`` is ``TransformerConfig.kernels``.
    """

    def __init__(self, setting: Setting, variant: str = "default", kernels: str = "auto") -> None:
        import jax

        from transformer_jax import Transformer, TransformerConfig
        from transformer_jax.model.config import to_dtype
        from transformer_jax.training.optimizer import transformer_optimizer, transformer_schedule
        from transformer_jax.training.parallel import DataParallel
        from transformer_jax.training.steps import create_train_state, train_step

        options = VARIANTS[variant]
        fields = {**setting.model, **options.get("model", {})}
        fields["dtype"] = to_dtype(fields.get("dtype", "float32"))
        fields["kernels"] = kernels
        self.config = TransformerConfig(**fields)
        model = Transformer(self.config)
        batch = random_batch(setting, tgt_vocab=self.config.tgt_vocab)
        key = jax.random.PRNGKey(0)
        params = jax.jit(lambda k: model.init(k, batch["src"][:1], batch["tgt_in"][:1]))(key)
        tx = transformer_optimizer(transformer_schedule(self.config.d_model, WARMUP_STEPS))
        rng_impl = options.get("rng_impl")
        rng = jax.random.key(1, impl=rng_impl) if rng_impl else jax.random.PRNGKey(1)
        state = create_train_state(params["params"], tx, rng)
        parallel = options.get("parallel", "jit")
        if parallel == "jit":
            step = functools.partial(train_step, model=model, label_smoothing=LABEL_SMOOTHING)
            self._step = jax.jit(step, donate_argnums=(0,))
            self.state, self.batch = state, jax.device_put(batch)
        else:  # the training loop's path: DataParallel over the local devices
            dp = DataParallel(parallel, model, LABEL_SMOOTHING)
            self._step = dp.train_step
            self.state, self.batch = dp.replicate(state), batch
        self.jitted = parallel == "jit"

    def step(self) -> None:
        import jax

        self.state, metrics = self._step(self.state, self.batch)
        jax.block_until_ready((self.state, metrics))

    def optimized_hlo(self) -> str:
        """XLA's optimised HLO of the jitted step (compiled again, not run)."""
        return self._step.lower(self.state, self.batch).compile().as_text()

    def run(self, steps: int) -> tuple[list[float], list[float]]:
        """Wall-clock and process CPU seconds of each of ``steps`` steps."""
        times, cpu = [], []
        for _ in range(steps):
            start, start_cpu = time.perf_counter(), time.process_time()
            self.step()
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        return times, cpu


def precision_of(variant: str) -> str:
    """The operand type of a variant's matrix products: ``bfloat16`` under
    ``matmul_precision='bfloat16'`` or ``dtype='bfloat16'``, else ``float32``."""
    model = VARIANTS[variant].get("model", {})
    bf16 = "bfloat16" in (model.get("matmul_precision"), model.get("dtype"))
    return "bfloat16" if bf16 else "float32"


class TorchWorker:
    """``benchmarks/torch_baseline.py`` in a child process, driven over stdin/stdout."""

    def __init__(
        self, setting: Setting, threads: int, system_malloc: bool, precision: str = "float32"
    ) -> None:
        from transformer_jax.kernels.malloc import retaining_environment

        spec = dict(
            dataclasses.asdict(setting),
            threads=threads,
            label_smoothing=LABEL_SMOOTHING,
            warmup_steps=WARMUP_STEPS,
            matmul_precision=precision,
        )
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_baseline.py")
        env = dict(os.environ, **({} if system_malloc else retaining_environment()))
        self.proc = subprocess.Popen(
            [sys.executable, script, json.dumps(spec)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.run(1)  # imports torch, builds the model, takes the first step

    def run(self, steps: int) -> tuple[list[float], list[float]]:
        """Wall-clock and process CPU seconds of each of ``steps`` steps."""
        self.proc.stdin.write(f"{steps}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(
                "the torch worker exited; is torch installed? (pip install -e .[torch])"
            )
        answer = json.loads(line)
        return answer["times"], answer["cpu"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


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


def print_floors(results: list[dict[str, Any]]) -> None:
    print(
        "\ndot floor: every matrix product of the compiled step timed alone, times its count "
        "(the step if nothing else cost anything); torch / floor = the most JAX/torch it allows"
    )
    floored = [r for r in results if "dot_floor" in r]
    rows = [
        [
            r["config"],
            r["variant"],
            r["step_s"]["median"],
            r["dot_floor"]["seconds"],
            f"{r['dot_floor']['step_vs_floor']:.2f}x",
            f"{100 * r['dot_floor']['mfu']:.1f}%",
            f"{r['dot_floor']['flops'] / 1e9:.1f} / {r['flops_per_step'] / 1e9:.1f}",
            f"{r['dot_floor']['torch_step_vs_floor']:.2f}x"
            if "torch_step_vs_floor" in r["dot_floor"]
            else "-",
        ]
        for r in floored
    ]
    headers = ["config", "variant", "step s", "dot floor s", "step / floor", "MFU at floor"]
    headers += ["GFLOP in dots / model", "torch step / floor"]
    print(table(headers, rows))
    for r in floored:
        print(f"\n{r['config']} {r['variant']}: the products, slowest in total first")
        dots = r["dot_floor"]["dots"]
        print(
            table(
                ["count", "product", "ms each", "GFLOP/s", "share of floor"],
                [
                    [
                        d["count"],
                        d["dot"],
                        1e3 * d["seconds"],
                        d["gflops_per_s"],
                        f"{100 * d['count'] * d['seconds'] / r['dot_floor']['seconds']:.1f}%",
                    ]
                    for d in dots
                ],
            )
        )


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


def main(argv: list[str] | None = None) -> dict[str, Any]:
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
    args = parser.parse_args(argv)
    if args.smoke:
        args.configs, args.steps, args.rounds, args.warmup = "tiny", 1, 1, 0
    names = args.configs.split(",")
    for name in names:
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

    if not args.system_malloc:
        from transformer_jax.kernels.malloc import retain_freed_memory

        retain_freed_memory()  # as train.py does, before the first JAX computation
    from transformer_jax.kernels.vectors import prefer_wide_vectors

    prefer_wide_vectors()  # as train.py does (XLA_FLAGS can set another width)
    info = machine()
    for variant in args.variants.split(","):
        cudnn = VARIANTS[variant].get("model", {}).get("attention_impl") == "cudnn"
        if cudnn and info["backend"] != "gpu":
            raise ValueError(
                f"--variants: {variant!r} (cuDNN attention) needs a GPU; the JAX backend "
                f"here is {info['backend']!r}"
            )
        bf16_products = precision_of(variant) == "bfloat16"
        if bf16_products and "xla" in args.kernels.split(",") and info["backend"] == "cpu":
            raise ValueError(
                f"--variants: {variant!r} with --kernels xla does not train on XLA:CPU (it "
                "rejects some bfloat16 products with float32 results); use --kernels cpu"
            )
    size = 256 if args.smoke else 8192 if info["backend"] == "gpu" else 2048
    precisions = list(dict.fromkeys(precision_of(v) for v in args.variants.split(",")))
    ceiling = {p: float("nan") for p in precisions}
    if not args.no_ceiling:
        ceiling = {p: matmul_ceiling(size, precision=p) for p in precisions}
    results = [row for name in names for row in measure(name, args)]
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
    for p, c in ceiling.items():
        print(
            f"{p} matmul ceiling: {c / 1e9:.1f} GFLOP/s (jitted {size}^3 matmul"
            f"{', float32 accumulation' if p != 'float32' else ''}, best of 5 before and 5 "
            "after the steps; the MFU of rows at this matmul precision)"
        )
    rows = [
        [
            r["config"],
            r["variant"],
            r["batch"],
            r["first_step_s"],
            r["tgt_tokens_per_s"]["median"],
            f"{r['tgt_tokens_per_s']['min']:,.0f}-{r['tgt_tokens_per_s']['max']:,.0f}",
            r["timed_steps"],
            r["flops_per_step"] / 1e9,
            r["gflops_per_s"],
            f"{100 * r['mfu']:.1f}%",
            *([f"{100 * r['mfu_vs_peak']:.1f}%"] if args.peak_tflops else []),
            r["step_cpu_s"]["median"],
            f"{r['speed_vs_first']:.2f}x",
        ]
        for r in results
    ]
    headers = ["config", "variant", "batch", "first step s", "tgt tok/s", "min-max", "steps"]
    headers += ["GFLOP/step", "GFLOP/s", "MFU"]
    headers += [f"MFU of {args.peak_tflops:g} TFLOP/s"] if args.peak_tflops else []
    headers += ["CPU s/step", "speed vs first row"]
    print(table(headers, rows))
    if any("dot_floor" in r for r in results):
        print_floors(results)
    if compiled:
        print("\ncompile: first training step in a fresh process (target < 15 s for small)")
        print(
            table(
                ["config", "variant", "layers", "first step s", "first step CPU s"],
                [
                    [
                        c["config"],
                        c["variant"],
                        c["layers"],
                        c["first_step_s"],
                        c["first_step_cpu_s"],
                    ]
                    for c in compiled
                ],
            )
        )
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
