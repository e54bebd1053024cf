"""Shared helpers of the benchmark scripts: timing, the machine description, tables, JSON.

Each script is run from the repository root (``python benchmarks/<name>.py``); this module
puts the root on ``sys.path`` so that the scripts import the library without installing it.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def cpu_model() -> str:
    """The ``model name`` line of /proc/cpuinfo (or the platform's processor string)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """Where a measurement was taken: cores, CPU, load, library versions, backend."""
    import flax
    import jax

    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "load_avg_1min": round(load, 2),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "flax": flax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def describe_machine(info: dict[str, Any]) -> str:
    loaded = (
        "  (UNDER LOAD: compare ratios only)" if info["load_avg_1min"] > 0.5 * info["nproc"] else ""
    )
    flags = f", XLA_FLAGS={info['xla_flags']!r}" if info.get("xla_flags") else ""
    return (
        f"{info['nproc']} x {info['cpu']}, jax {info['jax']} ({info['backend']}){flags}, "
        f"load avg {info['load_avg_1min']}{loaded}, {info['date_utc']} UTC"
    )


def time_calls(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls of ``fn`` (which must block until done)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def summary(times: Sequence[float]) -> dict[str, float]:
    """Median, min and max of a list of seconds."""
    return {"median": statistics.median(times), "min": min(times), "max": max(times)}


def matmul_ceiling(size: int = 2048, repeats: int = 5, precision: str = "float32") -> float:
    """Measured FLOP/s of a jitted ``[size, size] @ [size, size]`` (the best of ``repeats``
    runs): float32, or bfloat16 operands accumulated in float32 (``precision``).

    The denominator of model FLOPs utilisation (MFU): what this machine's XLA reaches on
    the most favourable dense kernel, rather than a datasheet number.
    """
    import jax
    import jax.numpy as jnp

    dtype = jnp.float32 if precision == "float32" else jnp.bfloat16
    a = jax.random.normal(jax.random.PRNGKey(0), (size, size), dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (size, size), dtype)
    matmul = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
    matmul(a, b).block_until_ready()
    times = time_calls(lambda: matmul(a, b).block_until_ready(), repeats)
    return 2 * size**3 / min(times)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-markdown table (also readable in a terminal)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    line = lambda values: (
        "| " + " | ".join(v.rjust(w) for v, w in zip(values, widths, strict=True)) + " |"
    )
    rule = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(headers), rule, *(line(r) for r in cells)])


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
    print(f"wrote {path}")
