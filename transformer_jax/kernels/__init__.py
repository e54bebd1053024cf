"""The one seam for backend-specific code: the ops the model calls and the process settings.

Two kernel sets give the same values (tests check it), in :mod:`.sets` (imported, with JAX,
when first named here: the host's settings below import no JAX):

- ``xla``: plain ``jnp.einsum`` / ``lax.dot_general`` at the configured precision,
  ``jax.random.bits`` for dropout (its mask kept as bits for the backward pass,
  :mod:`.dropout`), LayerNorm whose gradient keeps its output, not its input
  (:mod:`.norm`), autodiff elsewhere. What every platform but the CPU runs.
- ``cpu``: the same products shaped for XLA:CPU (operand layouts for its bfloat16 kernels,
  flattened dense layers, a blocked transpose and an ordered derivative for the tied
  logits: :mod:`.matmul`), dropout bits as fused elementwise code (:mod:`.dropout`) and
  flax's ``nn.LayerNorm``.

``TransformerConfig.kernels = 'auto'`` takes ``cpu`` when the *target* platform
(``TransformerConfig.platform``) is the CPU, ``xla`` otherwise
(:func:`transformer_jax.options.resolve`). :func:`configure_process`
applies the CPU runtime settings (:mod:`.malloc`, :mod:`.vectors`) on CPU hosts only;
:func:`fast_matmul_precision` names the products' arithmetic the target multiplies fastest.
"""

from __future__ import annotations

import importlib.metadata
import os

from transformer_jax.kernels import cpuinfo
from transformer_jax.kernels.malloc import retain_freed_memory
from transformer_jax.kernels.vectors import prefer_wide_vectors
from transformer_jax.lazy import lazy_names
from transformer_jax.options import PLATFORMS

# The kernel sets' names (:mod:`.sets`, JAX), imported on first use like the kernels' modules:
# the host's settings and choices below import no JAX.
__getattr__, __dir__ = lazy_names(
    __name__, {name: "sets" for name in ("Array", "CPU", "Ops", "XLA", "ops")}
)


def host_platform() -> str:
    """The platform JAX will start on, read without starting it: the first entry of
    ``JAX_PLATFORMS``, else 'gpu' or 'tpu' where an accelerator plugin is installed, else
    'cpu'."""
    chosen = os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
    if chosen:
        return chosen
    names = {(d.metadata["Name"] or "").lower().replace("_", "-") for d in _distributions()}
    if any(n.startswith(("jax-cuda", "jax-rocm")) for n in names):
        return "gpu"
    if any(n.startswith("libtpu") for n in names):
        return "tpu"
    return "cpu"


def _distributions() -> list[importlib.metadata.Distribution]:
    return list(importlib.metadata.distributions())


def target_platform(platform: str = "auto") -> str:
    """``platform`` (a ``model.platform``), :func:`host_platform` for 'auto'."""
    if platform not in PLATFORMS:
        raise ValueError(f"model.platform must be one of {PLATFORMS}, got {platform!r}")
    return host_platform() if platform == "auto" else platform


def configure_process(platform: str = "auto") -> bool:
    """On a CPU platform, set glibc malloc to reuse freed pages and XLA:CPU to use 512-bit
    vectors on AVX-512; elsewhere nothing. Call it before JAX starts (``platform='auto'``:
    :func:`host_platform`). Returns whether it applied the settings."""
    if target_platform(platform) != "cpu":
        return False
    retain_freed_memory()  # before XLA starts its threads
    prefer_wide_vectors()  # before XLA reads its flags
    return True


def fast_matmul_precision(platform: str = "auto") -> str:
    """The ``matmul_precision`` the target platform multiplies fastest: 'bfloat16' on GPUs and
    TPUs and on CPUs with bfloat16 instructions (:func:`.cpuinfo.has_bfloat16_products`),
    'float32' on other CPUs (``platform='auto'``: :func:`host_platform`)."""
    if target_platform(platform) != "cpu":
        return "bfloat16"
    return "bfloat16" if cpuinfo.has_bfloat16_products() else "float32"
