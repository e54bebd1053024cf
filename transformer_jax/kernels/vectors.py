"""512-bit vectors in the code XLA's CPU backend generates, on CPUs that have them.

XLA compiles its elementwise fusions (LayerNorm, softmax, dropout, Adam, layout copies)
with LLVM, and by default asks it for 256-bit vectors (``--xla_cpu_prefer_vector_width=256``)
even on AVX-512 CPUs; the matrix products run in libraries that choose their own vectors.
:func:`prefer_wide_vectors` sets 512 for this process unless ``XLA_FLAGS`` already chooses
a width, so those fusions use the whole register.
"""

from __future__ import annotations

import os

from transformer_jax.kernels.cpuinfo import has_avx512

FLAG = "--xla_cpu_prefer_vector_width"


def prefer_wide_vectors() -> bool:
    """Add ``--xla_cpu_prefer_vector_width=512`` to ``XLA_FLAGS`` on AVX-512 CPUs.

    Call it before the first JAX computation (XLA reads its flags when the backend starts;
    later it has no effect). Leaves a width already in ``XLA_FLAGS`` alone. Returns
    whether it added the flag.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if FLAG in flags or not has_avx512():
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {FLAG}=512".strip()
    return True
