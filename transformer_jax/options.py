"""The model's named choices: what ``TransformerConfig`` validates and the modules implement."""

ATTENTION_IMPLS = ("reference", "fused", "cudnn")  # model.attention
MATMUL_PRECISIONS = ("float32", "tf32", "bfloat16")  # kernels.precision
KERNELS = ("auto", "xla", "cpu")  # kernels: 'auto' = 'cpu' only when the target is the CPU
PLATFORMS = ("auto", "cpu", "gpu", "cuda", "rocm", "tpu")  # 'gpu': CUDA or ROCm, as JAX says
CUDA_PLATFORMS = ("gpu", "cuda")


def resolve(kernels: str, platform: str) -> str:
    """The kernel set ('xla' | 'cpu') for ``kernels`` on the target ``platform``."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
    if kernels != "auto":
        return kernels
    return "cpu" if platform == "cpu" else "xla"
