"""The host CPU's instruction sets, read from the ``flags`` line of ``/proc/cpuinfo``
(Linux; elsewhere none are reported): the package's CPU-specific choices read them here."""

from __future__ import annotations

CPUINFO = "/proc/cpuinfo"
# Instructions that multiply bfloat16 operands: AVX-512 BF16 dot products, AMX tiles.
BFLOAT16_PRODUCTS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str = CPUINFO) -> frozenset[str]:
    """The first processor's flags; empty where ``cpuinfo`` cannot be read."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def has_avx512(cpuinfo: str = CPUINFO) -> bool:
    """Whether the CPU reports AVX-512 (``avx512f``)."""
    return "avx512f" in cpu_flags(cpuinfo)


def has_bfloat16_products(cpuinfo: str = CPUINFO) -> bool:
    """Whether the CPU has an instruction that multiplies bfloat16 (:data:`BFLOAT16_PRODUCTS`)."""
    return any(flag in cpu_flags(cpuinfo) for flag in BFLOAT16_PRODUCTS)
