"""A prefill chunk of the embedded engine on a GPU: its wall time against the GPU's own work in it.

    python3 benchmarks/engine_prefill_gpu.py [--preset small] [--chunk 512] [--cached 0,1024] [--out prefill.json]

Drives the model directly (ForwardBatch + KVCache), as the engine's runner does for a prefill step:
one sequence, `--chunk` new tokens after `--cached` tokens already in the cache (random contents).

- wall: time.perf_counter around building the batch and the forward pass, then a device sync;
  median of --iters calls after warm-up.
- GPU busy: the union of the kernels' intervals in one call (torch profiler, CUDA activity).
- host share = 1 - GPU busy / wall: the part of the chunk the GPU spent waiting for the host.

Also lists the host's own hot spots (self CPU time per op) and the calls that wait for the device
(aten::item / _local_scalar_dense, cudaStreamSynchronize, device-to-host copies).
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch

from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.batch import build_batch
from rooftop.engine.model.config import ModelConfig
from rooftop.engine.model.weights import random_model
from rooftop.provenance import provenance

DEV = "cuda"
BLOCK = 64
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
            "cudaMemcpy", "aten::nonzero")


def chunk_call(model, cache, chunk: int, cached: int, capacity: int, graphs=None):
    """One prefill chunk: the batch built from host lists, then the forward pass (a graph replay with
    `graphs`, a PrefillGraphs)."""
    pages = math.ceil((cached + chunk) / BLOCK)
    tokens = [(7 * i + 65) % 256 for i in range(chunk)]

    def call():
        batch = build_batch([tokens], [cached], [list(range(pages))], BLOCK, capacity, "actual", DEV)
        return model(batch, cache) if graphs is None else graphs.run(batch)
    return call


def wall_ms(fn, iters: int) -> tuple[float, list[float]]:
    """Median ms of fn() with a device sync, and every call's ms (their spread is the figure's noise)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), times


def union_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (µs in, ms out)."""
    total, end = 0.0, -math.inf
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e3


def profile_call(fn) -> dict:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = prof.events()
    kernels = [(e.time_range.start, e.time_range.end) for e in events
               if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start]
    host = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    syncs: dict[str, int] = {}
    for e in host:
        if any(e.name.startswith(s) for s in SYNC_OPS):
            syncs[e.name] = syncs.get(e.name, 0) + 1
    ops = sorted(prof.key_averages(), key=lambda a: -a.self_cpu_time_total)
    return {
        "gpu_busy_ms": union_ms(kernels), "kernels": len(kernels), "syncs": syncs,
        "host_top": [{"op": a.key[:80], "self_cpu_ms": a.self_cpu_time_total / 1e3, "calls": a.count}
                     for a in ops[:20]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--cached", default="0,1024")
    ap.add_argument("--capacity", type=int, default=131072)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--graphs", action="store_true",
                    help="replay the chunk in a prefill CUDA graph (cuda_graphs.PrefillGraphs), as the engine serves it")
    ap.add_argument("--out", default="engine-prefill-gpu.json")
    args = ap.parse_args()
    config = ModelConfig.preset(args.preset)
    model = random_model(config, seed=0, device=DEV)
    cached_list = [int(c) for c in args.cached.split(",")]
    pages = math.ceil((max(cached_list) + args.chunk) / BLOCK)
    cache = KVCache(config, pages + 2, BLOCK, torch.bfloat16, DEV)
    for t in cache.latent + cache.index_k:
        t.normal_()
    graphs = None
    if args.graphs:
        from rooftop.engine.cuda_graphs import PrefillGraphs

        graphs = PrefillGraphs(model, cache, [args.chunk], max_seqs=8, max_pages=math.ceil(args.capacity / BLOCK),
                               dummy_block=cache.num_blocks - 1)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "preset": args.preset,
              "chunk": args.chunk, "graphs": args.graphs, "command": " ".join(sys.argv), "rows": []}
    for cached in cached_list:
        fn = chunk_call(model, cache, args.chunk, cached, args.capacity, graphs)
        median, times = wall_ms(fn, args.iters)
        row = {"cached": cached, "wall_ms": median, "wall_ms_min_max": [min(times), max(times)], **profile_call(fn)}
        row["host_share"] = 1 - row["gpu_busy_ms"] / row["wall_ms"]
        result["rows"].append(row)
        print(f"chunk {args.chunk} after {cached}: wall {row['wall_ms']:.2f} ms (min {min(times):.2f}, max "
              f"{max(times):.2f}), GPU busy {row['gpu_busy_ms']:.2f} ms "
              f"({row['kernels']} kernels), host share {row['host_share']:.1%}; syncs {row['syncs']}")
        for h in row["host_top"][:12]:
            print(f"    {h['self_cpu_ms']:8.2f} ms {h['calls']:6d}  {h['op']}")
        sys.stdout.flush()
    with open(args.out, "w") as f:
        json.dump({"provenance": provenance(), **result}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
