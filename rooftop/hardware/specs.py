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
        raise RooftopError(f"{self.name} has no peak for dtype {dtype!r}", "use bf16, fp8, fp4, tf32 or fp32")


# A GPU without fp4 units runs fp4 weights through fp8 (W4A8) or 16-bit (W4A16) tensor cores.
_FALLBACK = {
    "fp4": ("fp4", "fp8", "bf16"),
    "fp8": ("fp8", "bf16"),
    "int8": ("int8", "fp8", "bf16"),
    "fp16": ("fp16", "bf16"),
    "bf16": ("bf16",),
    "tf32": ("tf32",),
    "fp32": ("fp32",),
}

# Dense figures only: vendor tables mark 2:4-sparse ones with an asterisk, and the dense figure is
# half of those. fp32 is the non-tensor CUDA-core peak, the one elementwise and reduction kernels are
# bound by when not by memory; tf32 is the dense tensor-core figure.
# link_bandwidth_gb_s: NVLink / Infinity Fabric per direction (half the bidirectional figure), PCIe
# x16 per direction where a card has no NVLink (or only an optional two-card bridge).
_TF = {  # dense TFLOP/s per dtype
    # H100 SXM / H200 SXM datasheets: TF32 989*, BF16 1979*, FP8 3958* (sparse), FP32 67.
    "hopper": {"bf16": 989, "fp16": 989, "fp8": 1979, "int8": 1979, "tf32": 494.5, "fp32": 67},
    # H100 PCIe datasheet: TF32 756*, BF16 1513*, FP8 3026*, INT8 3026*, FP32 51.
    "h100-pcie": {"bf16": 756, "fp16": 756, "fp8": 1513, "int8": 1513, "tf32": 378, "fp32": 51},
    # H100 NVL datasheet: TF32 835*, BF16 1671*, FP8 3341*, INT8 3341*, FP32 60.
    "h100-nvl": {"bf16": 835.5, "fp16": 835.5, "fp8": 1670.5, "int8": 1670.5, "tf32": 417.5, "fp32": 60},
    # H20: no public NVIDIA datasheet; the figures reported from NVIDIA's product brief (dense:
    # FP16 148 is ~15% of H100's dense 989): FP8/INT8 296, BF16 148, TF32 74, FP32 44.
    "h20": {"bf16": 148, "fp16": 148, "fp8": 296, "int8": 296, "tf32": 74, "fp32": 44},
    # HGX B200 datasheet (8 GPUs): FP4 144 PF*, FP8 72 PF*, BF16 36 PF*, TF32 18 PF*.
    "b200": {"bf16": 2250, "fp16": 2250, "fp8": 4500, "int8": 4500, "fp4": 9000, "tf32": 1125, "fp32": 75},
    # GB200 NVL72 datasheet (72 GPUs): FP4 1440 PF*, FP8 720 PF*, INT8 720 POPS*, BF16 360 PF*,
    # TF32 180 PF*; the fp32 CUDA-core figure is B200's (approximate, bounds norms only).
    "gb200": {"bf16": 2500, "fp16": 2500, "fp8": 5000, "int8": 5000, "fp4": 10000, "tf32": 1250, "fp32": 75},
    # HGX B300 datasheet (8 GPUs): FP4 108 PF dense, FP8 72 PF*, BF16 36 PF*, TF32 18 PF*. Blackwell
    # Ultra cut INT8 to a fraction of fp8 and no dense figure is certain: int8 is left out, so an int8
    # matmul falls back to the fp8 peak (a floor below what the GPU can do, still a bound).
    "b300": {"bf16": 2250, "fp16": 2250, "fp8": 4500, "fp4": 13500, "tf32": 1125, "fp32": 75},
    # The datasheet gives no dense TF32: half the 16-bit figure, as on every tensor-core generation.
    "rtx-pro-6000": {"bf16": 468, "fp16": 468, "fp8": 936, "fp4": 1871, "tf32": 234, "fp32": 117},
    # A100 datasheet (SXM and PCIe alike): TF32 156 (312*), BF16 312 (624*), INT8 624 (1248*), FP32 19.5.
    "a100": {"bf16": 312, "fp16": 312, "int8": 624, "tf32": 156, "fp32": 19.5},
    # NVIDIA L40S datasheet: BF16 362.05 dense (733 is the sparse figure), FP8 733 dense, TF32 183.
    "l40s": {"bf16": 362, "fp16": 362, "fp8": 733, "int8": 733, "tf32": 183, "fp32": 91.6},
    # NVIDIA L4 datasheet: TF32 120*, BF16 242*, FP8 485*, INT8 485*, FP32 30.3.
    "l4": {"bf16": 121, "fp16": 121, "fp8": 242.5, "int8": 242.5, "tf32": 60, "fp32": 30.3},
    # AMD Instinct MI300X / MI325X datasheets (same compute): BF16 1307.4, FP8 2614.9, INT8 2614.9,
    # TF32 653.7 dense (sparse twice that), FP32 vector 163.4.
    "mi300": {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "int8": 2614.9, "tf32": 653.7, "fp32": 163.4},
}

# fmt: off
GPUS: dict[str, GPUSpec] = {
    # key:          GPUSpec(name, arch, SMs, memory GB, HBM GB/s, link GB/s per direction, dense TFLOP/s)
    "h100":         GPUSpec("H100 SXM", "sm_90", 132, 80, 3350, 450, dict(_TF["hopper"])),
    # H100 PCIe datasheet: 80 GB HBM2e at 2 TB/s, 114 SMs; PCIe Gen5 x16 (64 GB/s each way).
    "h100-pcie":    GPUSpec("H100 PCIe", "sm_90", 114, 80, 2000, 64, _TF["h100-pcie"]),
    # H100 NVL datasheet: 94 GB HBM3 at 3.9 TB/s, 132 SMs; NVLink bridge 600 GB/s (300 each way).
    "h100-nvl":     GPUSpec("H100 NVL", "sm_90", 132, 94, 3900, 300, _TF["h100-nvl"]),
    "h200":         GPUSpec("H200 SXM", "sm_90", 132, 141, 4800, 450, dict(_TF["hopper"])),
    # H20: 96 GB HBM3 at 4.0 TB/s, 78 SMs (as reported), NVLink 900 GB/s.
    "h20":          GPUSpec("H20", "sm_90", 78, 96, 4000, 450, _TF["h20"]),
    # FACTS.md gives 7.7-8 TB/s; 8 TB/s is the HGX B200 datasheet figure.
    "b200":         GPUSpec("B200", "sm_100", 148, 180, 8000, 900, _TF["b200"]),
    # GB200 NVL72: 13.4 TB HBM3e at 576 TB/s over 72 GPUs (186 GB, 8 TB/s each), NVLink 5 1.8 TB/s.
    # SMs as B200 (a trace's deviceProperties give the real count).
    "gb200":        GPUSpec("GB200", "sm_100", 148, 186, 8000, 900, _TF["gb200"]),
    # HGX B300: 288 GB HBM3e, 8 TB/s, NVLink 5 1.8 TB/s; 160 SMs (NVIDIA's Blackwell Ultra blog).
    "b300":         GPUSpec("B300", "sm_103", 160, 288, 8000, 900, _TF["b300"]),
    # No NVLink: PCIe Gen5 x16, 64 GB/s each way.
    "rtx-pro-6000": GPUSpec("RTX PRO 6000 Blackwell Server", "sm_120", 188, 96, 1790, 64, _TF["rtx-pro-6000"]),
    "a100":         GPUSpec("A100 SXM 80GB", "sm_80", 108, 80, 2039, 300, _TF["a100"]),
    # A100 datasheet: 40 GB HBM2 at 1555 GB/s; 80 GB PCIe at 1935 GB/s; PCIe Gen4 x16 32 GB/s each way.
    "a100-40gb":    GPUSpec("A100 SXM 40GB", "sm_80", 108, 40, 1555, 300, _TF["a100"]),
    "a100-pcie":    GPUSpec("A100 PCIe 80GB", "sm_80", 108, 80, 1935, 32, _TF["a100"]),
    "a100-pcie-40gb": GPUSpec("A100 PCIe 40GB", "sm_80", 108, 40, 1555, 32, _TF["a100"]),
    # PCIe Gen4 x16: 64 GB/s both ways together.
    "l40s":         GPUSpec("L40S", "sm_89", 142, 48, 864, 32, _TF["l40s"]),
    # NVIDIA L4 datasheet: 24 GB GDDR6 at 300 GB/s, 58 SMs (7424 CUDA cores), PCIe Gen4 x16.
    "l4":           GPUSpec("L4", "sm_89", 58, 24, 300, 32, _TF["l4"]),
    # AMD datasheets: MI300X 192 GB HBM3 at 5.3 TB/s, MI325X 256 GB HBM3E at 6 TB/s; 304 CUs (in
    # the SMs column); Infinity Fabric 7 links x 128 GB/s bidirectional = 448 GB/s each way.
    "mi300x":       GPUSpec("MI300X", "gfx942", 304, 192, 5300, 448, _TF["mi300"]),
    "mi325x":       GPUSpec("MI325X", "gfx942", 304, 256, 6000, 448, _TF["mi300"]),
}
# fmt: on

# Lenient names: compared after lower-casing and dropping everything but letters and digits,
# so "H200", "h200-sxm" and torch's "NVIDIA H200" all land on the same entry.
_ALIASES = {
    "h100": ["h100", "h100sxm", "h100sxm5", "h10080gbhbm3", "h100sxm580gb"],
    "h100-pcie": ["h100pcie", "h100pcie80gb", "h10080gbpcie"],
    "h100-nvl": ["h100nvl", "h100nvl94gb"],
    "h200": ["h200", "h200sxm", "h200sxm141gb", "h200141gbhbm3e"],
    "h20": ["h20", "h2096gb", "h20hbm3"],
    "b200": ["b200", "hgxb200", "dgxb200"],
    "gb200": ["gb200", "gb200nvl72", "gb200nvl"],
    "b300": ["b300", "hgxb300", "dgxb300", "b300sxm6ac", "b300sxm6"],
    "rtx-pro-6000": [
        "rtxpro6000",
        "rtxpro6000blackwell",
        "rtxpro6000blackwellserver",
        "rtxpro6000blackwellserveredition",
        "rtx6000pro",
        "pro6000",
    ],
    "a100": ["a100", "a100sxm", "a100sxm80gb", "a100sxm480gb", "a10080gb"],
    "a100-40gb": ["a10040gb", "a100sxm40gb", "a100sxm440gb"],
    "a100-pcie": ["a100pcie", "a100pcie80gb", "a10080gbpcie"],
    "a100-pcie-40gb": ["a100pcie40gb", "a10040gbpcie"],
    "l40s": ["l40s"],
    "l4": ["l4"],
    "mi300x": ["mi300x", "amdinstinctmi300x", "instinctmi300x", "amdinstinctmi300xvf", "amdmi300x"],
    "mi325x": ["mi325x", "amdinstinctmi325x", "instinctmi325x", "amdinstinctmi325xvf", "amdmi325x"],
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
    peaks = {dtype: fp32_tflops for dtype in ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")}
    return GPUSpec(
        "CPU (measured)", "cpu", 0, 0, copy_bytes_s / 1e9, copy_bytes_s / 1e9, peaks, measured=True
    )


def _timed(fn) -> float:
    start_ns = time.perf_counter_ns()
    fn()
    return max(time.perf_counter_ns() - start_ns, 1) / 1e9
