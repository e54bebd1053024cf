"""train_throughput.py's printed tables: the steps, the dot floor's products, compile times."""

from __future__ import annotations

from typing import Any

from _common import table


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


def print_results(
    results: list[dict[str, Any]], ceiling: dict[str, float], size: int, peak_tflops: float | None
) -> None:
    """The matmul ceilings, then one row per timed worker (MFU against its precision's)."""
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
            *([f"{100 * r['mfu_vs_peak']:.1f}%"] if peak_tflops else []),
            r["step_cpu_s"]["median"],
            f"{r['speed_vs_first']:.2f}x",
        ]
        for r in results
    ]
    headers = ["config", "variant", "batch", "first step s", "tgt tok/s", "min-max", "steps"]
    headers += ["GFLOP/step", "GFLOP/s", "MFU"]
    headers += [f"MFU of {peak_tflops:g} TFLOP/s"] if peak_tflops else []
    headers += ["CPU s/step", "speed vs first row"]
    print(table(headers, rows))


def print_compile(compiled: list[dict[str, Any]]) -> None:
    """First-step seconds of fresh processes (``--compile``)."""
    print("\ncompile: first training step in a fresh process (target < 15 s for small)")
    keys = ["config", "variant", "layers", "first_step_s", "first_step_cpu_s"]
    headers = ["config", "variant", "layers", "first step s", "first step CPU s"]
    print(table(headers, [[c[k] for k in keys] for c in compiled]))
