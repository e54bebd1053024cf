"""Scaled dot-product attention: reference vs fused, forward and forward+backward, over N.

``transformer_jax.model.attention.scaled_dot_product_attention`` with ``impl='reference'`` (the
paper's equation with explicit float32 weights) and ``impl='fused'``
(``jax.nn.dot_product_attention``), self-attention of N queries over N keys,
``[batch, N, heads, head_dim]`` float32, no mask. For each N: median seconds of the jitted
forward and of the jitted gradient (forward + backward w.r.t. q, k, v), and XLA's own
memory analysis of each compiled program (``temp_size_in_bytes``: scratch buffers, where
the N x N scores and probabilities live), next to the analytic size of one float32
N x N matrix per head (``transformer_jax.analysis.costs.attention_matrix_bytes``). The scratch
memory grows as N^2: 4x per doubling of N.

    python benchmarks/attention.py            # N = 128 ... 2048, one head
    python benchmarks/attention.py --full     # N = 128 ... 4096
"""

from __future__ import annotations

import argparse
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
import jax
import jax.numpy as jnp
from _common import describe_machine, machine, summary, table, time_calls, write_json

from transformer_jax.analysis.costs import attention_matrix_bytes, format_bytes
from transformer_jax.model.attention import scaled_dot_product_attention
from transformer_jax.options import ATTENTION_IMPLS

DEFAULT_IMPLS = "reference,fused"  # 'cudnn' needs a GPU


def compiled_pair(impl: str, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """The compiled forward and gradient programs for q = k = v of ``shape``."""

    def forward(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return scaled_dot_product_attention(q, k, v, impl=impl)

    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.sum(forward(q, k, v) ** 2)

    spec = jax.ShapeDtypeStruct(shape, jnp.float32)
    fwd = jax.jit(forward).lower(spec, spec, spec).compile()
    bwd = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(spec, spec, spec).compile()
    return fwd, bwd


def measure(n: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Both implementations at one N, their calls alternating (same load for both)."""
    shape = (args.batch, n, args.heads, args.head_dim)
    keys = jax.random.split(jax.random.PRNGKey(n), 3)
    q, k, v = (jax.random.normal(key, shape, jnp.float32) for key in keys)
    programs = {}
    for impl in args.impls:
        programs[impl, "forward"], programs[impl, "backward"] = compiled_pair(impl, shape)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in programs}
    for _ in range(args.repeats + 1):  # the first round is a warm-up
        for key, program in programs.items():
            times[key] += time_calls(lambda p=program: jax.block_until_ready(p(q, k, v)), 1)
    matrix = attention_matrix_bytes(1, args.heads, n, batch=args.batch, bytes_per_element=4)
    results = []
    for impl in args.impls:
        result: dict[str, Any] = {"n": n, "impl": impl, "nxn_matrix_bytes": matrix}
        for name in ("forward", "backward"):
            result[f"{name}_s"] = summary(times[impl, name][1:])
            stats = programs[impl, name].memory_analysis()
            result[f"{name}_temp_bytes"] = int(stats.temp_size_in_bytes)
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="128,256,512,1024,2048", help="comma list of N")
    parser.add_argument("--full", action="store_true", help="N = 128 ... 4096")
    parser.add_argument("--impls", default=DEFAULT_IMPLS, help=f"comma list of {ATTENTION_IMPLS}")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="N = 16 and 32, one repeat")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    if args.full:
        args.lengths = "128,256,512,1024,2048,4096"
    if args.smoke:
        args.lengths, args.repeats = "16,32", 1
    lengths = [int(x) for x in args.lengths.split(",")]
    args.impls = args.impls.split(",")
    for impl in args.impls:
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"--impls: {impl!r} is not one of {ATTENTION_IMPLS}")
    for name in ("batch", "heads", "head_dim", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if min(lengths) < 1:
        raise ValueError(f"--lengths must be positive integers, got {args.lengths!r}")

    results = [row for n in lengths for row in measure(n, args)]
    info = machine()
    print(f"machine: {describe_machine(info)}")
    print(
        f"self-attention, q = k = v [{args.batch}, N, {args.heads}, {args.head_dim}] float32, "
        f"no mask; median of {args.repeats}; memory: XLA temp_size_in_bytes"
    )
    previous: dict[str, int] = {}
    rows = []
    for r in results:
        growth = r["forward_temp_bytes"] / previous[r["impl"]] if r["impl"] in previous else None
        previous[r["impl"]] = r["forward_temp_bytes"]
        rows.append(
            [
                r["n"],
                r["impl"],
                1e3 * r["forward_s"]["median"],
                1e3 * r["backward_s"]["median"],
                format_bytes(r["forward_temp_bytes"]),
                f"{growth:.2f}x" if growth else "",
                format_bytes(r["backward_temp_bytes"]),
                format_bytes(r["nxn_matrix_bytes"]),
            ]
        )
    headers = [
        "N",
        "impl",
        "fwd ms",
        "fwd+bwd ms",
        "fwd temp memory",
        "vs N/2",
        "fwd+bwd temp memory",
        "one NxN f32/head",
    ]
    print(table(headers, rows))
    payload = {"machine": info, "settings": vars(args), "results": results}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
