"""Turn an eager Kineto trace into what a CUDA-graph replay of the same steps records, for tests.

In a replayed step the host runs one `CUDAGraph::replay` op and one `cudaGraphLaunch`; every kernel
of the step shares that launch's correlation and has no CPU op, no shapes and no module frames of
its own. The kernels keep their names, times and order, except where asked to differ as a graph can:
`fuse` merges each listed pair of consecutive kernels (by position in the step) into one, `drop`
removes kernels, `swap` exchanges two neighbours.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

_HOST_CATS = ("cpu_op", "python_function", "cuda_runtime", "cuda_driver")


def graphify(src: Path, dst: Path, *, fuse: tuple[int, ...] = (), drop: tuple[int, ...] = (),
             swap: tuple[int, ...] = ()) -> Path:
    """Write the graph-replay version of trace `src` to `dst` (plain JSON); returns `dst`."""
    opener = gzip.open if src.suffix == ".gz" else open
    with opener(src, "rt") as f:
        top = json.load(f)
    events = top["traceEvents"]
    ranges = [e for e in events if e.get("cat") == "user_annotation" and e.get("ph") == "X"]
    names = [e["name"] for e in ranges]
    # ProfilerStep#N, else the repeated range (the embedded engine's "decode_step")
    step_name = "ProfilerStep#" if any(n.startswith("ProfilerStep#") for n in names) else \
        max(set(names), key=names.count) if names else None
    steps = sorted((e for e in ranges if step_name and e["name"].startswith(step_name)), key=lambda e: e["ts"])
    if not steps:
        raise ValueError(f"{src} has no step ranges")
    host_tid = steps[0]["tid"], steps[0]["pid"]

    def step_of(ts: float) -> int:
        for i, s in enumerate(steps):
            if s["ts"] <= ts < s["ts"] + s["dur"]:
                return i
        return -1

    launch_step = {}  # correlation -> step of its launch
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launch_step[e["args"]["correlation"]] = step_of(e["ts"])
    kept, kernels_by_step = [], {}
    for e in events:
        cat = e.get("cat")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            s = launch_step.get(e.get("args", {}).get("correlation"), -1)
            if s >= 0:
                kernels_by_step.setdefault(s, []).append(e)
                continue
        elif cat in _HOST_CATS and step_of(e.get("ts", -1)) >= 0:
            continue  # the host side of a replayed step is one op and one launch, added below
        elif cat == "ac2g":
            continue
        kept.append(e)
    for i, s in enumerate(steps):
        corr, ext = 900_000 + i, 800_000 + i
        t0 = s["ts"] + 1
        kept.append({"ph": "X", "cat": "cpu_op", "name": "CUDAGraph::replay", "pid": host_tid[1], "tid": host_tid[0],
                     "ts": t0, "dur": 20, "args": {"External id": ext}})
        kept.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": host_tid[1],
                     "tid": host_tid[0], "ts": t0 + 5, "dur": 10, "args": {"External id": ext, "correlation": corr}})
        ks = sorted(kernels_by_step.get(i, []), key=lambda k: k["ts"])
        for a in sorted(fuse, reverse=True):
            if a + 1 < len(ks):
                first, second = ks[a], ks.pop(a + 1)
                ks[a] = {**first, "name": f"fused_{a}_{a + 1}", "dur": first["dur"] + second["dur"]}
        for d in sorted(drop, reverse=True):
            if d < len(ks):
                ks.pop(d)
        for a in swap:
            if a + 1 < len(ks):
                ks[a], ks[a + 1] = ({**ks[a + 1], "ts": ks[a]["ts"]}, {**ks[a], "ts": ks[a]["ts"] + ks[a + 1]["dur"]})
        for k in ks:
            args = {key: v for key, v in k.get("args", {}).items() if key != "External id"}
            kept.append({**k, "args": {**args, "correlation": corr}})
    top["traceEvents"] = kept
    dst.write_text(json.dumps(top))
    return dst
