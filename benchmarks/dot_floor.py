"""The dot floor of a compiled step: its matrix products, each timed alone.

XLA's optimised HLO of a step lists every product (``dot``) with its operands' shapes,
element types and layouts. Each distinct one, jitted alone on operands stored in the same
layouts, is timed, and the times (each times how often it occurs) add up to the dot floor:
the step's seconds if nothing but the products cost anything and each ran as fast as it
does alone. It bounds what this machine's XLA kernels allow: the MFU a step can reach
(model FLOPs / floor / ceiling) and its speed against another framework's step. The
listed products' FLOPs equal ``transformer_jax.analysis.costs``' analytic count when none is
missed (the tests check it). Products inside loops (``nn.scan`` over layers) would count
once each, so such steps are refused.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
import statistics
from typing import Any

from _common import time_calls

_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64"}
# `%name = shape op(operands), attributes`, as XLA prints an instruction; an array's shape
# is `type[dims]{layout}`.
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+) = (?P<shape>.+?) (?P<op>[\w\-]+)"
    r"\((?P<operands>[^)]*)\)(?P<attrs>.*)$"
)
_ARRAY = re.compile(r"^(?P<type>\w+)\[(?P<dims>[\d,]*)\](?:\{(?P<layout>[\d,]*)[^}]*\})?$")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%(?P<name>[\w.\-]+) ")  # a computation's first line


@dataclasses.dataclass(frozen=True)
class Operand:
    """An operand's element type, logical shape and physical order (major to minor)."""

    dtype: str
    shape: tuple[int, ...]
    order: tuple[int, ...]

    def __str__(self) -> str:
        stored = "" if self.order == tuple(range(len(self.shape))) else f" stored {self.order}"
        return f"{self.dtype}{list(self.shape)}{stored}"


@dataclasses.dataclass(frozen=True)
class Dot:
    """One product: ``lax.dot_general(lhs, rhs, dimension_numbers)`` with an output type."""

    lhs: Operand
    rhs: Operand
    out_dtype: str
    lhs_contracting: tuple[int, ...]
    rhs_contracting: tuple[int, ...]
    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]

    @property
    def flops(self) -> int:
        """2 x (every output element) x (the contracted length)."""
        free_rhs = [
            n
            for i, n in enumerate(self.rhs.shape)
            if i not in self.rhs_contracting and i not in self.rhs_batch
        ]
        return 2 * math.prod(self.lhs.shape) * math.prod(free_rhs)

    def describe(self) -> str:
        dims = f"contract {list(self.lhs_contracting)}.{list(self.rhs_contracting)}"
        if self.lhs_batch:
            dims += f", batch {list(self.lhs_batch)}.{list(self.rhs_batch)}"
        return f"{self.lhs} x {self.rhs} -> {self.out_dtype} ({dims})"


def dots(hlo_text: str) -> collections.Counter[Dot]:
    """Every product of an optimised HLO module's text, with how often it occurs."""
    instructions, computation_of, calls = {}, {}, collections.defaultdict(set)
    loop_bodies, computation = set(), None
    for line in hlo_text.splitlines():
        start = _COMPUTATION.match(line)
        if start:
            computation = start["name"]
        m = _INSTRUCTION.match(line)
        if m:
            instructions[m["name"]] = m
            computation_of[m["name"]] = computation
            called = dict(re.findall(r"\b(\w+)=%([\w.\-]+)", m["attrs"]))
            calls[computation].update(called.values())
            for group in re.findall(r"\b\w+=\{(%[^}]*)\}", m["attrs"]):  # branches
                calls[computation].update(re.findall(r"%([\w.\-]+)", group))
            if m["op"] == "while":
                loop_bodies.add(called["body"])
    in_loops = _reachable(loop_bodies, calls)

    def operand(name: str) -> Operand:
        m = _ARRAY.match(instructions[name]["shape"])
        shape = tuple(int(n) for n in m["dims"].split(",") if n)
        minor_to_major = [int(n) for n in (m["layout"] or "").split(",") if n]
        order = tuple(reversed(minor_to_major)) if minor_to_major else tuple(range(len(shape)))
        return Operand(_dtype(m["type"]), shape, order)

    def dims(attrs: str, key: str) -> tuple[int, ...]:
        m = re.search(rf"\b{key}=\{{([\d,]*)\}}", attrs)
        return tuple(int(n) for n in m.group(1).split(",") if n) if m else ()

    found: collections.Counter[Dot] = collections.Counter()
    for m in instructions.values():
        if m["op"] != "dot":
            continue
        if computation_of[m["name"]] in in_loops:
            raise ValueError(f"{m['name']} runs in a loop (nn.scan?): its count is unknown")
        lhs, rhs = re.findall(r"%([\w.\-]+)", m["operands"])
        found[
            Dot(
                operand(lhs),
                operand(rhs),
                _dtype(_ARRAY.match(m["shape"])["type"]),
                dims(m["attrs"], "lhs_contracting_dims"),
                dims(m["attrs"], "rhs_contracting_dims"),
                dims(m["attrs"], "lhs_batch_dims"),
                dims(m["attrs"], "rhs_batch_dims"),
            )
        ] += 1
    return found


def _reachable(roots: set[str], calls: dict[str, set[str]]) -> set[str]:
    """The computations ``roots`` are and call, directly or not."""
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(calls[name])
    return seen


def _dtype(hlo_type: str) -> str:
    if hlo_type not in _DTYPES:
        raise ValueError(f"a product of element type {hlo_type!r}: not a float type")
    return _DTYPES[hlo_type]


def time_dot(dot: Dot, repeats: int) -> float:
    """Median seconds of the product alone (jitted, operands stored in the step's layouts)."""
    import jax
    import jax.numpy as jnp

    def stored(x: Operand, seed: int) -> jax.Array:
        physical = [x.shape[i] for i in x.order]
        return jax.random.normal(jax.random.PRNGKey(seed), physical, jnp.dtype(x.dtype))

    def logical(x: jax.Array, operand: Operand) -> jax.Array:
        return jnp.transpose(x, [operand.order.index(i) for i in range(len(operand.shape))])

    numbers = ((dot.lhs_contracting, dot.rhs_contracting), (dot.lhs_batch, dot.rhs_batch))
    product = jax.jit(
        lambda a, b: jax.lax.dot_general(
            logical(a, dot.lhs),
            logical(b, dot.rhs),
            numbers,
            preferred_element_type=jnp.dtype(dot.out_dtype),
        )
    )
    a, b = stored(dot.lhs, 0), stored(dot.rhs, 1)
    product(a, b).block_until_ready()
    return statistics.median(time_calls(lambda: product(a, b).block_until_ready(), repeats))


def dot_floor(hlo_text: str, repeats: int = 10) -> dict[str, Any]:
    """The step's products timed alone: ``{'seconds', 'flops', 'dots': [...]}``, the dots
    (count, description, seconds each, GFLOP/s) slowest in total first."""
    rows = []
    for dot, count in dots(hlo_text).items():
        seconds = time_dot(dot, repeats)
        rows.append(
            {
                "count": count,
                "dot": dot.describe(),
                "seconds": seconds,
                "gflops_per_s": dot.flops / seconds / 1e9,
                "flops": dot.flops,
            }
        )
    rows.sort(key=lambda r: -r["count"] * r["seconds"])
    return {
        "seconds": sum(r["count"] * r["seconds"] for r in rows),
        "flops": sum(r["count"] * r["flops"] for r in rows),
        "dots": rows,
    }
