"""Peak figures of the GPUs rooftop knows (dense, vendor datasheets) and of this machine's CPU."""

import functools
import re
import time
from dataclasses import dataclass, field

import numpy as np

from rooftop.errors import RooftopError


@dataclass(slots=True)
class GPUSpec:
    """One accelerator: memory bandwidth, dense tensor peaks per dtype, interconnect."""

    name: str
    arch: str
    sms: int
    memory_gb: float
    hbm_bandwidth_gb_s: float  # device memory, GB/s (1e9)
    link_bandwidth_gb_s: float  # GPU-to-GPU, one direction, GB/s
    dense_tflops: dict[str, float] = field(default_factory=dict)  # dtype -> dense TFLOP/s
    measured: bool = False  # True when the figures were measured here, not read from a datasheet

    @property
    def bandwidth_bytes_s(self) -> float:
        """Device-memory bandwidth in bytes/s."""
        return self.hbm_bandwidth_gb_s * 1e9

    @property
    def link_bytes_s(self) -> float:
        """GPU-to-GPU bandwidth in bytes/s, one direction."""
        return self.link_bandwidth_gb_s * 1e9

    def peak_flops(self, dtype: str) -> float:
        """Dense peak in FLOP/s for a matmul in `dtype`; an absent unit falls back to the next wider one."""
        for candidate in _FALLBACK.get(dtype, (dtype,)):
            if candidate in self.dense_tflops:
                return self.dense_tflops[candidate] * 1e12
        raise RooftopError(f"{self.name} has no peak for dtype {dtype!r}", "use bf16, fp8, fp4 or fp32")


# A GPU without fp4 units runs fp4 weights through fp8 (W4A8) or 16-bit (W4A16) tensor cores.
_FALLBACK = {
    "fp4": ("fp4", "fp8", "bf16"),
    "fp8": ("fp8", "bf16"),
    "int8": ("int8", "fp8", "bf16"),
    "fp16": ("fp16", "bf16"),
    "bf16": ("bf16",),
    "fp32": ("fp32",),
}

# Dense figures only (several public tables quote 2:4-sparse ones). fp32 is the non-tensor
# CUDA-core peak, the one elementwise and reduction kernels are bound by when not by memory.
# link_bandwidth_gb_s: NVLink per direction (half the bidirectional figure), PCIe x16 per
# direction where a card has no NVLink.
_TF = {  # dense TFLOP/s per dtype
    "hopper": {"bf16": 989, "fp16": 989, "fp8": 1979, "int8": 1979, "fp32": 67},
    "b200": {"bf16": 2250, "fp16": 2250, "fp8": 4500, "int8": 4500, "fp4": 9000, "fp32": 75},
    "rtx-pro-6000": {"bf16": 468, "fp16": 468, "fp8": 936, "fp4": 1871, "fp32": 117},
    "a100": {"bf16": 312, "fp16": 312, "int8": 624, "fp32": 19.5},
    # NVIDIA L40S datasheet: BF16 362.05 dense (733 is the sparse figure), FP8 733 dense.
    "l40s": {"bf16": 362, "fp16": 362, "fp8": 733, "int8": 733, "fp32": 91.6},
}

# fmt: off
GPUS: dict[str, GPUSpec] = {
    # key:          GPUSpec(name, arch, SMs, memory GB, HBM GB/s, link GB/s per direction, dense TFLOP/s)
    "h100":         GPUSpec("H100 SXM", "sm_90", 132, 80, 3350, 450, dict(_TF["hopper"])),
    "h200":         GPUSpec("H200 SXM", "sm_90", 132, 141, 4800, 450, dict(_TF["hopper"])),
    # FACTS.md gives 7.7-8 TB/s; 8 TB/s is the HGX B200 datasheet figure.
    "b200":         GPUSpec("B200", "sm_100", 148, 180, 8000, 900, _TF["b200"]),
    # No NVLink: PCIe Gen5 x16, 64 GB/s each way.
    "rtx-pro-6000": GPUSpec("RTX PRO 6000 Blackwell Server", "sm_120", 188, 96, 1790, 64, _TF["rtx-pro-6000"]),
    "a100":         GPUSpec("A100 SXM 80GB", "sm_80", 108, 80, 2039, 300, _TF["a100"]),
    # PCIe Gen4 x16: 64 GB/s both ways together.
    "l40s":         GPUSpec("L40S", "sm_89", 142, 48, 864, 32, _TF["l40s"]),
}
# fmt: on

# Lenient names: compared after lower-casing and dropping everything but letters and digits,
# so "H200", "h200-sxm" and torch's "NVIDIA H200" all land on the same entry.
_ALIASES = {
    "h100": ["h100", "h100sxm", "h100sxm5", "h10080gbhbm3", "h100sxm580gb"],
    "h200": ["h200", "h200sxm", "h200sxm141gb", "h200141gbhbm3e"],
    "b200": ["b200", "hgxb200", "dgxb200"],
    "rtx-pro-6000": [
        "rtxpro6000",
        "rtxpro6000blackwell",
        "rtxpro6000blackwellserver",
        "rtxpro6000blackwellserveredition",
        "rtx6000pro",
        "pro6000",
    ],
    "a100": ["a100", "a100sxm", "a100sxm80gb", "a100sxm480gb", "a10080gb"],
    "l40s": ["l40s"],
    "cpu": ["cpu", "host"],
}


def _norm(name: str) -> str:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    return key.removeprefix("nvidia")


def known_names() -> list[str]:
    """The canonical names `gpu_spec` accepts."""
    return list(_ALIASES)


def gpu_spec(name: str) -> GPUSpec:
    """The spec for a lenient GPU name ('h200', 'NVIDIA H200', 'rtx-pro-6000', 'cpu')."""
    key = _norm(name)
    for canonical, aliases in _ALIASES.items():
        if key in aliases:
            return cpu_spec() if canonical == "cpu" else GPUS[canonical]
    raise RooftopError(f"unknown GPU {name!r}", f"use one of: {', '.join(known_names())}")


@functools.cache
def cpu_spec() -> GPUSpec:
    """This machine's CPU, measured once per process: copy bandwidth (numpy) and fp32 matmul peak."""
    src = np.ones(16 * 1024 * 1024, dtype=np.float32)  # 64 MiB, past any last-level cache
    dst = np.empty_like(src)
    best_copy_s = min(_timed(lambda: np.copyto(dst, src)) for _ in range(5))
    copy_bytes_s = 2 * src.nbytes / best_copy_s  # read + write, as the GPU figures count it
    a = np.ones((512, 512), dtype=np.float32)
    a @ a  # warm the BLAS threads
    best_mm_s = min(_timed(lambda: a @ a) for _ in range(5))
    fp32_tflops = 2 * 512**3 / best_mm_s / 1e12
    peaks = {dtype: fp32_tflops for dtype in ("fp32", "bf16", "fp16", "fp8", "int8", "fp4")}
    return GPUSpec(
        "CPU (measured)", "cpu", 0, 0, copy_bytes_s / 1e9, copy_bytes_s / 1e9, peaks, measured=True
    )


def _timed(fn) -> float:
    start_ns = time.perf_counter_ns()
    fn()
    return max(time.perf_counter_ns() - start_ns, 1) / 1e9
