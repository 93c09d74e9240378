"""Per-kernel truth from Nsight Compute: achieved DRAM bandwidth and FLOP rate against the GPU's peaks,
tensor-pipe use, and where each kernel sits on the roofline.

A trace names the kernels that take a step's time; ncu replays those kernels (one metric pass at a
time) while a command runs them, and writes a report file. The report is read through ncu's own
Python module (`ncu_report`, in ncu's `extras/python`), never from its console table. FLOPs are
counted from ncu's operation counters: tensor-path operations (`sm__ops_path_tensor_*`), and CUDA-core
fused multiply-adds (two operations each), adds and multiplies.

    rooftop profile TRACE --ncu "python3 step.py"        # run step.py under ncu, top kernels of TRACE
    rooftop profile TRACE --ncu-report step.ncu-rep      # read a report ncu already wrote
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rooftop.errors import RooftopError
from rooftop.hardware.specs import GPUSpec

# rooftop's name -> ncu metric. Those the installed ncu does not know are left out of the command.
METRICS = {
    "time_ns": "gpu__time_duration.sum",
    "dram_bytes": "dram__bytes.sum",
    "tensor_bf16": "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
    "tensor_fp16": "sm__ops_path_tensor_src_fp16_dst_fp32.sum",
    "tensor_fp16_fp16": "sm__ops_path_tensor_src_fp16_dst_fp16.sum",
    "tensor_tf32": "sm__ops_path_tensor_src_tf32_dst_fp32.sum",
    "tensor_fp8": "sm__ops_path_tensor_src_fp8.sum",
    "ffma": "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "fadd": "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "fmul": "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "hfma": "smsp__sass_thread_inst_executed_op_hfma_pred_on.sum",
    "hadd": "smsp__sass_thread_inst_executed_op_hadd_pred_on.sum",
    "hmul": "smsp__sass_thread_inst_executed_op_hmul_pred_on.sum",
    "tensor_pipe_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "gmma_pipe_pct": "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
}
_TENSOR = ("tensor_bf16", "tensor_fp16", "tensor_fp16_fp16", "tensor_tf32", "tensor_fp8")


@dataclass(slots=True)
class KernelRoofline:
    """One kernel as ncu measured it (means over its profiled launches) and where it sits on the roofline."""

    name: str
    launches: int
    time_us: float
    dram_gb_s: float
    tflop_s: float
    tensor_tflop_s: float
    tensor_pipe_pct: float | None  # share of the tensor pipe's peak cycles it kept busy
    intensity: float  # FLOP per DRAM byte
    bound: str  # "memory" or "compute": which roof is lower at its intensity
    pct_of_bound: float  # achieved against that roof
    peak_flops_used: str  # which compute peak it is held to: "tensor bf16", "tensor fp8", ... or "CUDA-core fp32"

    def row(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


def base_name(kernel: str) -> str:
    """The function's own name, as ncu's default --kernel-name-base matches it:
    'void at::native::reduce_kernel<512, 1, ...>(...)' -> 'reduce_kernel'. The parameter list and the
    template arguments are taken off the end (brackets matched, so `(anonymous namespace)::` scopes and
    lambdas inside template arguments stay whole), then the last identifier is the name, whatever
    return type (`std::enable_if<...>::type`) and scopes precede it."""
    name = kernel.strip()
    for close, open_ in ((")", "("), (">", "<")):
        if name.endswith(close):
            at = _matching_open(name, close, open_)
            if at is None:
                break
            name = name[:at].rstrip()
    ident = _LAST_IDENT.search(name)
    return ident.group(0) if ident else kernel


_LAST_IDENT = re.compile(r"[A-Za-z_$][\w$]*$")


def _matching_open(text: str, close: str, open_: str) -> int | None:
    """Index of the bracket `open_` that matches the `close` ending `text`."""
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        if text[i] == close:
            depth += 1
        elif text[i] == open_:
            depth -= 1
            if depth == 0:
                return i
    return None


def find_ncu(ncu: str | None = None) -> Path:
    """The ncu executable: `ncu`, else on PATH; RooftopError where there is none."""
    path = shutil.which(ncu or "ncu")
    if path is None:
        raise RooftopError("Nsight Compute (ncu) is not on this host's PATH",
                           "run on a GPU host with Nsight Compute, or pass --ncu-report with a report made there")
    return Path(os.path.realpath(path))


def report_module(ncu: Path | None = None):
    """ncu's `ncu_report` Python module, from the installation `ncu` belongs to."""
    try:
        return importlib.import_module("ncu_report")
    except ImportError:
        pass
    ncu = ncu or find_ncu()
    # beside the executable, or in the Nsight Compute installation a CUDA toolkit's `ncu` wrapper starts
    candidates = [ncu.parent / "extras" / "python", ncu.parent.parent / "extras" / "python",
                  *sorted(Path("/opt/nvidia").glob("nsight-compute/*/extras/python"), reverse=True),
                  *sorted(ncu.parent.parent.glob("nsight-compute*/extras/python"), reverse=True)]
    for candidate in candidates:
        if (candidate / "ncu_report.py").is_file():
            sys.path.insert(0, str(candidate))
            return importlib.import_module("ncu_report")
    raise RooftopError(f"no ncu_report module beside {ncu}", "use an Nsight Compute installation with extras/python")


def known_metrics(ncu: Path) -> set[str]:
    """Base names of the metrics this ncu reports for the GPU at hand (`ncu --query-metrics`)."""
    out = subprocess.run([str(ncu), "--query-metrics"], capture_output=True, text=True, timeout=300)
    return set(re.findall(r"^([a-z0-9_]+__[a-z0-9_]+)\s", out.stdout, re.M))


def ncu_command(ncu: Path, command: list[str], kernels: list[str], report: Path, launches: int,
                known: set[str] | None = None, nvtx_range: str | None = None) -> list[str]:
    """ncu's argv: profile the launches of `kernels` (by base name) that `command` makes, up to `launches`,
    collecting METRICS (those ncu knows), into `report` (.ncu-rep); only inside the NVTX range `nvtx_range`
    where one is given (the step, not the set-up that launches the same kernels)."""
    metrics = [m for m in METRICS.values() if known is None or m.split(".")[0] in known]
    names = "|".join(re.escape(base_name(k)) for k in dict.fromkeys(kernels))
    nvtx = ["--nvtx", "--nvtx-include", f"{nvtx_range}/"] if nvtx_range else []
    return [str(ncu), "--clock-control", "none", "--target-processes", "all", *nvtx,
            "--kernel-name", f"regex:^({names})$", "--launch-count", str(launches), "--metrics", ",".join(metrics),
            "--export", str(report), "--force-overwrite", *command]


def run_ncu(command: list[str], kernels: list[str], report: Path, launches: int = 300,
            timeout_s: float = 1800, nvtx_range: str | None = None) -> Path:
    """Run `command` under ncu for `kernels`; the report's path (RooftopError with ncu's last lines)."""
    ncu = find_ncu()
    argv = ncu_command(ncu, command, kernels, report.with_suffix(""), launches, known_metrics(ncu), nvtx_range)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    path = report.with_suffix(".ncu-rep") if report.suffix != ".ncu-rep" else report
    if done.returncode != 0 or not path.is_file():
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise RooftopError(f"ncu failed (exit {done.returncode}); its last lines:\n{tail}",
                           "check the command runs on its own, and that ncu may read the GPU's counters")
    return path


def read_report(path: Path, ncu: Path | None = None) -> dict[str, list[dict[str, float]]]:
    """{kernel base name: [one dict of METRICS values per profiled launch]} from an .ncu-rep file."""
    mod = report_module(ncu)
    ctx = mod.load_report(str(path))
    out: dict[str, list[dict[str, float]]] = {}
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for a in range(rng.num_actions()):
            action = rng.action_by_idx(a)
            values = {}
            for key, metric in METRICS.items():
                m = action.metric_by_name(metric)
                if m is not None:
                    values[key] = float(m.as_double())
            out.setdefault(base_name(action.name()), []).append(values)
    return out


# each tensor path's ops and the dtype whose dense peak it is held to
_TENSOR_DTYPE = {"tensor_bf16": "bf16", "tensor_fp16": "fp16", "tensor_fp16_fp16": "fp16", "tensor_tf32": "tf32",
                 "tensor_fp8": "fp8"}


def tensor_peak(gpu: GPUSpec, dtype: str) -> tuple[float, str]:
    """The dense tensor peak (FLOP/s) a `dtype` path is held to, and how it is named. A spec without a tf32
    figure gets half its bf16 one: tf32 runs at half the 16-bit rate on every tensor-core generation."""
    if dtype == "tf32" and "tf32" not in gpu.dense_tflops:
        return gpu.peak_flops("bf16") / 2, "tensor tf32 (half the bf16 peak)"
    return gpu.peak_flops(dtype), f"tensor {dtype}"


def roofline(name: str, launches: list[dict[str, float]], gpu: GPUSpec) -> KernelRoofline:
    """Where one kernel sits: its mean time, DRAM bandwidth and FLOP rate over its launches against the
    GPU's memory roof and the compute roof it can reach: where it used the tensor path, the peak of each
    tensor dtype it ran (fp8, bf16, tf32 ...; a mix is held to the time its FLOPs would take at their
    peaks), else the CUDA-core fp32 peak. Its tensor-pipe use is the time-weighted mean over launches."""
    def total(key: str) -> float:
        return sum(v.get(key, 0.0) for v in launches)

    time_s = total("time_ns") / 1e9 or 1e-12
    by_path = {k: total(k) for k in _TENSOR if total(k) > 0}
    tensor_flops = sum(by_path.values())
    core_flops = 2 * (total("ffma") + total("hfma")) + total("fadd") + total("fmul") + total("hadd") + total("hmul")
    flops, dram = tensor_flops + core_flops, total("dram_bytes")
    tensor = tensor_flops > 0
    if tensor:
        peaks: dict[str, tuple[float, str]] = {}
        for k in by_path:
            peaks.setdefault(_TENSOR_DTYPE[k], tensor_peak(gpu, _TENSOR_DTYPE[k]))
        seconds_at_peak = sum(ops / peaks[_TENSOR_DTYPE[k]][0] for k, ops in by_path.items())
        peak_flops = tensor_flops / seconds_at_peak  # one dtype: its peak; a mix: the rate its FLOPs allow
        ranked = sorted(peaks, key=lambda d: -sum(ops for k, ops in by_path.items() if _TENSOR_DTYPE[k] == d))
        used = peaks[ranked[0]][1] if len(ranked) == 1 else "tensor " + "+".join(ranked)
    else:
        peak_flops, used = gpu.peak_flops("fp32"), "CUDA-core fp32"
    intensity = flops / dram if dram > 0 else float("inf")
    ridge = peak_flops / gpu.bandwidth_bytes_s
    memory_bound = intensity < ridge
    achieved_bw, achieved_flops = dram / time_s, flops / time_s
    return KernelRoofline(
        name=name, launches=len(launches), time_us=time_s / len(launches) * 1e6, dram_gb_s=achieved_bw / 1e9,
        tflop_s=achieved_flops / 1e12, tensor_tflop_s=tensor_flops / time_s / 1e12,
        tensor_pipe_pct=_pipe_pct(launches), intensity=intensity,
        bound="memory" if memory_bound else "compute",
        pct_of_bound=(achieved_bw / gpu.bandwidth_bytes_s if memory_bound else achieved_flops / peak_flops) * 100,
        peak_flops_used=used,
    )


def _pipe_pct(launches: list[dict[str, float]]) -> float | None:
    """The tensor pipe's busy share over the kernel's launches, weighted by their time. A launch's share is
    that of the pipe it used (Hopper's warpgroup pipe `gmma`, or `hmma`)."""
    num = den = 0.0
    for v in launches:
        pct = [v[k] for k in ("gmma_pipe_pct", "tensor_pipe_pct") if k in v]
        if pct:
            weight = v.get("time_ns", 0.0) or 1.0
            num += max(pct) * weight
            den += weight
    return num / den if den else None


def kernel_table(report: dict[str, list[dict[str, float]]], gpu: GPUSpec) -> list[KernelRoofline]:
    """Every kernel of a report on the roofline, longest total time first."""
    rows = [roofline(name, launches, gpu) for name, launches in report.items() if launches]
    rows.sort(key=lambda r: -r.time_us * r.launches)
    return rows
