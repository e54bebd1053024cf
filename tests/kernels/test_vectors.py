"""``transformer_jax.kernels.vectors``: 512-bit vectors for XLA's CPU code on AVX-512."""

import os

import pytest

from transformer_jax.kernels import vectors

DEVICES = "--xla_force_host_platform_device_count=4"
WIDE = "--xla_cpu_prefer_vector_width=512"


@pytest.mark.parametrize(
    "avx512,before,after",
    [
        (True, None, WIDE),
        (True, DEVICES, f"{DEVICES} {WIDE}"),  # appended to the user's flags
        (True, "--xla_cpu_prefer_vector_width=256", "--xla_cpu_prefer_vector_width=256"),
        (False, None, None),
    ],
)
def test_prefer_wide_vectors_adds_the_flag_once(monkeypatch, avx512, before, after):
    monkeypatch.setattr(vectors, "has_avx512", lambda: avx512)
    if before is None:
        monkeypatch.delenv("XLA_FLAGS", raising=False)
    else:
        monkeypatch.setenv("XLA_FLAGS", before)
    assert vectors.prefer_wide_vectors() == (after != before)
    assert os.environ.get("XLA_FLAGS") == after
    assert not vectors.prefer_wide_vectors()  # a second call changes nothing
    assert os.environ.get("XLA_FLAGS") == after
