"""Small synthetic Kineto traces for the eager-map tests: an eager trace (module ranges, CPU ops with
shapes, launches, kernels) and a CUDA-graph replay of the same steps (one `cudaGraphLaunch` a step, its
kernels with no CPU op, shapes or modules), written as the PyTorch profiler writes them.

A step is a list of (module path, kernel name, kernel us, Input Dims); each step may sit in a
record_function range named by its label (None: no range)."""

from __future__ import annotations

import json
from pathlib import Path

PID, TID = 100, 100
LAYER = ("Model_0", "Layer_0")


class Events:
    """Trace events and the next correlation and External id."""

    def __init__(self):
        self.ev: list[dict] = []
        self.corr, self.ext = 1, 1

    def x(self, cat: str, name: str, ts: float, dur: float, pid=PID, tid=TID, **args) -> None:
        self.ev.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
                        "args": args})

    def dump(self, path: Path, gpu: str = "NVIDIA H200") -> Path:
        top = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": gpu, "computeMajor": 9, "computeMinor": 0}],
               "traceEvents": self.ev}
        Path(path).write_text(json.dumps(top))
        return Path(path)


def eager(steps, labels, path=None, *, t0=1000.0, gap=50.0, device=0, events: Events | None = None):
    """Each step run eagerly: per item a module range, a CPU op with its shapes, a launch and its kernel."""
    t = events or Events()
    ts = t0
    for items, label in zip(steps, labels, strict=True):
        start, gpu, cur = ts, ts + 5, ts + 1
        for module_path, kernel, us, dims in items:
            for depth, seg in enumerate(module_path):
                t.x("python_function", f"nn.Module: {seg}", cur + depth * 0.01, 3.0 - depth * 0.02)
            op_ts = cur + 0.5
            t.x("cpu_op", f"aten::{kernel.split('_')[0]}", op_ts, 2.0, **{"External id": t.ext, "Input Dims": dims})
            t.x("cuda_runtime", "cudaLaunchKernel", op_ts + 0.5, 1.0, correlation=t.corr, **{"External id": t.ext})
            gpu = max(gpu, op_ts + 2)
            t.x("kernel", kernel, gpu, us, pid=device, tid=7, device=device, stream=7, correlation=t.corr)
            gpu += us + 0.2
            t.corr += 1
            t.ext += 1
            cur += 3.1
        end = max(cur, gpu) + 1
        t.x("python_function", f"nn.Module: {LAYER[0]}", start + 0.5, cur - start - 0.4)
        if label is not None:
            t.x("user_annotation", label, start, end - start)
        ts = end + gap
    return t.dump(path) if path is not None else t


def graph(steps, labels, path=None, *, t0=1000.0, gap=50.0, device=0, events: Events | None = None):
    """Each step replayed from a CUDA graph: one launch, every kernel sharing its correlation."""
    t = events or Events()
    ts = t0
    for items, label in zip(steps, labels, strict=True):
        start = ts
        t.x("cuda_runtime", "cudaGraphLaunch", ts + 1, 5.0, correlation=t.corr)
        gpu = ts + 7
        for _module, kernel, us, _dims in items:
            t.x("kernel", kernel, gpu, us, pid=device, tid=7, device=device, stream=7, correlation=t.corr)
            gpu += us + 0.2
        t.corr += 1
        end = gpu + 1
        if label is not None:
            t.x("user_annotation", label, start, end - start)
        ts = end + gap
    return t.dump(path) if path is not None else t


def decode_step(ctx: int = 4096) -> list:
    """A DSA-style decode step: the indexer scores the whole capacity `ctx`."""
    return [(LAYER + ("Attention_0", "Indexer_0"), "indexer_logits_kernel", 100.0, [[16, ctx, 64]]),
            (LAYER + ("Attention_0", "Indexer_0"), "topk_kernel", 20.0, [[16, ctx]]),
            (LAYER + ("Attention_0",), "paged_decode_kernel", 30.0, [[16, 1, 576]]),
            (LAYER + ("MoE_0",), "fused_moe_kernel", 40.0, [[16, 1024]]),
            (LAYER + ("RMSNorm_0",), "rms_norm_kernel", 5.0, [[16, 1024]])]


def prefill_step() -> list:
    return [(LAYER + ("Attention_0",), "flash_fwd_kernel", 400.0, [[2048, 576]]),
            (LAYER + ("MoE_0",), "fused_moe_kernel", 300.0, [[2048, 1024]]),
            (LAYER + ("Attention_0", "Indexer_0"), "indexer_prefill_kernel", 200.0, [[2048, 64]]),
            (LAYER + ("RMSNorm_0",), "rms_norm_kernel", 20.0, [[2048, 1024]])]


# each component's share of a decode step (its kernels' time over the step's)
DECODE_SHARES = {"indexer": 120 / 195, "attention": 30 / 195, "moe": 40 / 195, "norm": 5 / 195}
