"""The GPUs a plan compiles for: each one's device description and its published peaks.

:func:`target_config` writes a GPU's ``GpuTargetConfig`` text proto (XLA's
``stream_executor`` device description), which ``jax.experimental.topologies`` takes to
compile for that GPU without one. The peaks (dense tensor-core bfloat16 and TF32, CUDA-core
float32, HBM and NVLink bandwidth) are NVIDIA's data-sheet figures for the SXM parts; a plan divides
FLOPs and bytes by them for its roofline estimate. :data:`KINDS` names the peaks of each
variant (SXM, PCIe, NVL, GH200) by the device kind the driver reports, for measured MFU;
:func:`software_versions` names the jax and CUDA libraries installed.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata

MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU model: what XLA's compiler needs, and the peaks a roofline divides by."""

    name: str  # the device description string, as the driver names it
    compute_capability: tuple[int, int]
    sm_count: int
    fpus_per_sm: int  # CUDA cores (float32 units) per SM
    clock_ghz: float  # boost clock
    memory_bytes: int  # HBM
    memory_bandwidth: float  # bytes/s
    l2_cache_bytes: int
    shared_memory_per_sm: int
    shared_memory_per_block_optin: int
    peak_bf16: float  # dense tensor-core FLOP/s
    peak_tf32: float
    peak_fp32: float  # CUDA cores (what float32 products at HIGHEST run on)
    nvlink_bandwidth: float  # bytes/s each way per GPU, within a host

    def peak_flops(self, precision: str) -> float:
        """The peak FLOP/s of matrix products at ``model.matmul_precision`` (or 'bfloat16'
        for ``model.dtype=bfloat16``)."""
        return {"bfloat16": self.peak_bf16, "tf32": self.peak_tf32, "float32": self.peak_fp32}[
            precision
        ]


H100 = Gpu(
    name="NVIDIA H100 80GB HBM3",
    compute_capability=(9, 0),
    sm_count=132,
    fpus_per_sm=128,
    clock_ghz=1.98,
    memory_bytes=81559 * MIB,
    memory_bandwidth=3.35e12,
    l2_cache_bytes=50 * MIB,
    shared_memory_per_sm=228 * 1024,
    shared_memory_per_block_optin=227 * 1024,
    peak_bf16=989.4e12,
    peak_tf32=494.7e12,
    peak_fp32=66.9e12,
    nvlink_bandwidth=450e9,
)
GPUS = {
    "h100": H100,
    "a100": Gpu(
        name="NVIDIA A100-SXM4-80GB",
        compute_capability=(8, 0),
        sm_count=108,
        fpus_per_sm=64,
        clock_ghz=1.41,
        memory_bytes=81920 * MIB,
        memory_bandwidth=2.039e12,
        l2_cache_bytes=40 * MIB,
        shared_memory_per_sm=164 * 1024,
        shared_memory_per_block_optin=163 * 1024,
        peak_bf16=312e12,
        peak_tf32=156e12,
        peak_fp32=19.5e12,
        nvlink_bandwidth=300e9,
    ),
    # the H100's chip with 141 GB of HBM3e
    "h200": dataclasses.replace(
        H100, name="NVIDIA H200", memory_bytes=143771 * MIB, memory_bandwidth=4.8e12
    ),
}


@dataclasses.dataclass(frozen=True)
class Kind:
    """A GPU variant as a device kind names it (``match``, case-insensitive, the first entry
    of :data:`KINDS` that the kind contains): its dense peaks and the plan's ``--gpu``."""

    match: str
    name: str
    peaks: tuple[float, float, float]  # bfloat16, TF32, float32 FLOP/s
    plan_gpu: str

    def peak_flops(self, precision: str) -> float:
        """:meth:`Gpu.peak_flops` of this variant."""
        return dict(zip(("bfloat16", "tf32", "float32"), self.peaks, strict=True))[precision]


def _peaks(gpu: Gpu) -> tuple[float, float, float]:
    return gpu.peak_bf16, gpu.peak_tf32, gpu.peak_fp32


NVL = (835e12, 417.5e12, 60e12)  # H100 NVL and H200 NVL data sheets (dense)
KINDS = (
    Kind("H100 PCIe", "H100 PCIe", (756e12, 378e12, 51.2e12), "h100"),
    Kind("H100 NVL", "H100 NVL", NVL, "h100"),
    Kind("GH200", "GH200", _peaks(H100), "h100"),
    Kind("H200 NVL", "H200 NVL", NVL, "h200"),
    Kind("H200", "H200 SXM", _peaks(GPUS["h200"]), "h200"),
    Kind("H100", "H100 SXM", _peaks(H100), "h100"),
    Kind("A100", "A100", _peaks(GPUS["a100"]), "a100"),  # 40 and 80 GB, SXM and PCIe
)


def device_gpu(device_kind: str) -> Kind | None:
    """The :class:`Kind` of a device's ``device_kind`` (e.g. 'NVIDIA H100 80GB HBM3'), or None."""
    return next((k for k in KINDS if k.match.lower() in device_kind.lower()), None)


SOFTWARE = {  # what the programs were compiled with: name -> pip distribution
    "jax": "jax",
    "jaxlib": "jaxlib",
    "CUDA plugin": "jax-cuda12-plugin",
    "CUDA": "nvidia-cuda-runtime-cu12",
    "cuDNN": "nvidia-cudnn-cu12",
}


def software_versions() -> dict[str, str]:
    """The installed version of each of :data:`SOFTWARE` ('-' where not installed)."""
    versions = {}
    for name, distribution in SOFTWARE.items():
        try:
            versions[name] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "-"
    return versions


# The usable share of a GPU's memory: XLA_PYTHON_CLIENT_MEM_FRACTION's default.
DEFAULT_MEMORY_FRACTION = 0.75

# Between hosts: one 400 Gb/s InfiniBand NDR adapter per GPU (the DGX/HGX layout), each way.
NETWORK_BANDWIDTH = 50e9


def get_gpu(name: str) -> Gpu:
    """The GPU called ``name`` (a key of ``GPUS``); ValueError naming the choices."""
    if name not in GPUS:
        raise ValueError(f"--gpu must be one of {sorted(GPUS)}, got {name!r}")
    return GPUS[name]


CUDNN_VERSION = (9, 10, 0)  # the cuDNN the compiled programs assume


def target_config(gpu: Gpu, cudnn_version: tuple[int, int, int] = CUDNN_VERSION) -> str:
    """``gpu``'s GpuTargetConfig text proto; ``cudnn_version``: the cuDNN the compiled
    program assumes."""
    major, minor = gpu.compute_capability
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {gpu.shared_memory_per_sm}
  threads_per_core_limit: 2048
  core_count: {gpu.sm_count}
  fpus_per_core: {gpu.fpus_per_sm}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(gpu.memory_bandwidth)}
  l2_cache_size: {gpu.l2_cache_bytes}
  clock_rate_ghz: {gpu.clock_ghz}
  device_memory_size: {gpu.memory_bytes}
  shared_memory_per_block_optin: {gpu.shared_memory_per_block_optin}
  cuda_compute_capability {{
    major: {major}
    minor: {minor}
  }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{
  major: {cudnn_version[0]}
  minor: {cudnn_version[1]}
  patch: {cudnn_version[2]}
}}
device_description_str: "{gpu.name}"
"""
