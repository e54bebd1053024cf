"""``transformer_jax.kernels.cpuinfo`` and the choices read from it: the CPU's flags decide
512-bit vectors and, on a CPU target, the arithmetic of ``fast_matmul_precision``."""

import pytest

from transformer_jax import kernels
from transformer_jax.kernels import cpuinfo

AMX = "fpu sse avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile"
ZEN4 = "fpu sse avx2 fma avx512f avx512bw avx512_bf16"
SKYLAKE = "fpu sse avx2 fma avx512f avx512bw avx512cd"  # AVX-512 without bfloat16
AVX2 = "fpu sse avx2 fma"


def cpuinfo_file(tmp_path, flags):
    path = tmp_path / "cpuinfo"
    # two processors, as Linux lists them: the first one's flags are read
    path.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    return str(path)


@pytest.mark.parametrize(
    "flags,avx512,bf16",
    [(AMX, True, True), (ZEN4, True, True), (SKYLAKE, True, False), (AVX2, False, False)],
)
def test_the_flags_say_which_instructions_the_cpu_has(tmp_path, flags, avx512, bf16):
    path = cpuinfo_file(tmp_path, flags)
    assert cpuinfo.cpu_flags(path) == frozenset(flags.split())
    assert cpuinfo.has_avx512(path) is avx512
    assert cpuinfo.has_bfloat16_products(path) is bf16


def test_no_cpuinfo_reports_no_instructions(tmp_path):
    missing = str(tmp_path / "missing")
    assert cpuinfo.cpu_flags(missing) == frozenset()
    assert not cpuinfo.has_avx512(missing) and not cpuinfo.has_bfloat16_products(missing)


@pytest.mark.parametrize(
    "platform,flags,expected",
    [
        ("cpu", ZEN4, "bfloat16"),
        ("cpu", SKYLAKE, "float32"),
        ("cpu", AVX2, "float32"),
        ("cuda", AVX2, "bfloat16"),  # the target's arithmetic, not the host CPU's
        ("gpu", AVX2, "bfloat16"),
        ("tpu", AVX2, "bfloat16"),
    ],
)
def test_fast_matmul_precision_follows_the_target(monkeypatch, platform, flags, expected):
    monkeypatch.setattr(cpuinfo, "cpu_flags", lambda path=cpuinfo.CPUINFO: frozenset(flags.split()))
    assert kernels.fast_matmul_precision(platform) == expected
    monkeypatch.setenv("JAX_PLATFORMS", platform)  # 'auto': the platform JAX will start on
    assert kernels.fast_matmul_precision("auto") == expected


def test_fast_matmul_precision_names_an_unknown_platform():
    with pytest.raises(ValueError, match="model.platform must be one of"):
        kernels.fast_matmul_precision("metal")
