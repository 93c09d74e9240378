"""The embedded engine's decode step on a GPU: torch reference kernels vs Triton kernels + CUDA
graphs, beside the roofline floor. Drives the model directly (ForwardBatch + KVCache).

    python3 benchmarks/engine_decode_gpu.py [--preset small] [--context 1024] [--capacity 131072]
                                            [--concurrency 1,16,64] [--out engine-decode.json]
                                            [--graphs-only] [--set MODULE.NAME=JSON ...]

Every sequence holds `--context` tokens (random cache contents); `--capacity` is --context-length
(the capacity bound's scored length, and the graphs' block-table width). Step time: CUDA events
around one step, median of --iters steps after warm-up (the step's own host work included).
"""

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

import torch
from kernels_gpu import parse_knob, replay_times_ms, write_result  # this folder's (run as a script)

from rooftop.engine.cuda_graphs import DecodeGraphs
from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.batch import build_batch
from rooftop.engine.model.config import ModelConfig, count_params
from rooftop.engine.model.weights import random_model

DEV = "cuda"
BLOCK = 64


def step_ms(fn, iters: int) -> float:
    """Median ms of fn() (one decode step) over `iters`, after 3 warm-ups."""
    return statistics.median(replay_times_ms(fn, iters, warmup=3))


def kernel_breakdown(fn, steps: int = 3, top: int = 40) -> list[dict]:
    """GPU time per step of each kernel name over `steps` calls of fn (torch profiler), largest first."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    rows = [{"kernel": e.key[:90], "us_per_step": e.device_time_total / steps, "calls_per_step": e.count / steps}
            for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r["us_per_step"])
    total = sum(r["us_per_step"] for r in rows)
    return [{"kernel": "TOTAL", "us_per_step": total, "calls_per_step": sum(r["calls_per_step"] for r in rows)}] + rows[:top]


def roofline_floor_ms(config: ModelConfig, batch: int, context: int) -> float | None:
    """The decode step's floor on an H200 from rooftop.roofline (None if it does not import)."""
    try:
        from rooftop.roofline import decode_costs, floors, load_model_shape
    except ImportError as e:
        print(f"roofline unavailable: {e}")
        return None
    with tempfile.TemporaryDirectory() as d:
        config.to_json(os.path.join(d, "config.json"))
        shape = load_model_shape(d)
    return floors(decode_costs(shape, batch, context), "h200").floor_ms


def profile_step(result: dict, graphs, model, cache, c: int, pages: int, args) -> None:
    """Kernel-by-kernel GPU time of one graphed decode step at concurrency c (eager if that fails)."""
    tables = [[b * pages + j for j in range(pages)] for b in range(c)]
    new = [[(7 * b + 65) % 256] for b in range(c)]
    batch = build_batch(new, [args.context - 1] * c, tables, BLOCK, args.capacity, "actual", DEV)
    for name, fn in (("graphs", lambda: graphs.run(batch)), ("eager", lambda: model(batch, cache))):
        try:
            rows = kernel_breakdown(fn)
        except Exception as e:  # the profiler is a diagnosis aid; its failure must not lose the numbers
            print(f"profile of {name} failed: {e}")
            continue
        result[f"kernels_{name}_c{c}"] = rows
        print(f"\nkernels of one {name} decode step at C={c} (us per step, calls per step):")
        for r in rows:
            print(f"{r['us_per_step']:9.1f} {r['calls_per_step']:7.1f}  {r['kernel']}")
        if len(rows) > 3:
            return


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--capacity", type=int, default=131072)
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--breakdown-at", default="",
                    help="concurrencies to profile kernel by kernel (default: the largest)")
    ap.add_argument("--out", default="engine-decode-gpu.json")
    ap.add_argument("--skinny-rows", type=int, default=None,
                    help="projections of up to this many rows in triton_matmul (0: all in cuBLAS)")
    ap.add_argument("--moe-few-tokens", default=None, help="JSON tiles for triton_moe.FEW_TOKENS_CONFIG")
    ap.add_argument("--moe-few-tokens-max", type=int, default=None, help="triton_moe.FEW_TOKENS")
    ap.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=JSON",
                    help="set a module constant before the run (an A/B knob), e.g. "
                         "rooftop.engine.kernels.triton_sparse_mla.MERGE_IN_KERNEL_BYTES=0; repeatable")
    ap.add_argument("--graphs-only", action="store_true", help="time only the graphed Triton step (no reference)")
    args = ap.parse_args()
    for item in args.set:
        setattr(*parse_knob(item))
    if args.skinny_rows is not None:
        from rooftop.engine.kernels import dispatch

        dispatch._SKINNY_ROWS = args.skinny_rows
    if args.moe_few_tokens:
        from rooftop.engine.kernels import triton_moe

        triton_moe.FEW_TOKENS_CONFIG = json.loads(args.moe_few_tokens)
    if args.moe_few_tokens_max is not None:
        from rooftop.engine.kernels import triton_moe

        triton_moe.FEW_TOKENS = args.moe_few_tokens_max
    conc = [int(c) for c in args.concurrency.split(",")]
    config = ModelConfig.preset(args.preset)
    params = count_params(config)
    t0 = time.time()
    model = random_model(config, seed=0, device=DEV)  # drawn on the GPU
    max_c = max(conc)
    pages = math.ceil(args.context / BLOCK)
    cache = KVCache(config, max_c * pages + 1, BLOCK, torch.bfloat16, DEV)
    for t in cache.latent + cache.index_k:
        t.normal_()
    cap_pages = math.ceil(args.capacity / BLOCK)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "preset": args.preset,
              "params": params.total, "active_params": params.active_per_token, "context": args.context,
              "capacity": args.capacity, "command": " ".join(sys.argv), "set": args.set, "rows": []}
    print(f"{args.preset}: {params.total / 1e9:.2f} B parameters, context {args.context}, capacity {args.capacity}")
    graphs = DecodeGraphs(model, cache, conc, max_pages=cap_pages, dummy_block=cache.num_blocks - 1)
    print(f"captured graphs at {conc} in {time.time() - t0:.0f} s (from start)")
    for c in conc:
        tables = [[b * pages + j for j in range(pages)] for b in range(c)]
        new = [[(7 * b + 65) % 256] for b in range(c)]  # distinct tokens: routing spreads as in real batches
        cached = [args.context - 1] * c
        row = {"concurrency": c}
        runs = (
            ("reference_actual", "reference", "actual", False),
            ("reference_capacity", "reference", "capacity", False),
            ("triton_eager", "auto", "actual", False),
            ("triton_graphs", "auto", "actual", True),
        )
        for name, mode, bound, graphed in runs[3:] if args.graphs_only else runs:
            os.environ["ROOFTOP_KERNELS"] = mode
            batch = build_batch(new, cached, tables, BLOCK, args.capacity, bound, DEV)
            fn = (lambda b=batch: graphs.run(b)) if graphed else (lambda b=batch: model(b, cache))
            iters = max(3, args.iters // 4) if name == "reference_capacity" else args.iters
            row[name + "_ms"] = step_ms(fn, iters)
        row["floor_ms"] = roofline_floor_ms(config, c, args.context)
        for name in ("reference_actual", "reference_capacity", "triton_eager", "triton_graphs"):
            if name + "_ms" in row:
                row[name + "_tok_s"] = c / row[name + "_ms"] * 1e3
        if row["floor_ms"]:
            row["graphs_over_floor"] = row["triton_graphs_ms"] / row["floor_ms"]
        result["rows"].append(row)
        print(f"C={c}: reference {row.get('reference_actual_ms', float('nan')):.2f} ms (capacity bound "
              f"{row.get('reference_capacity_ms', float('nan')):.2f}), triton eager "
              f"{row.get('triton_eager_ms', float('nan')):.2f}, triton+graphs "
              f"{row['triton_graphs_ms']:.2f} ms = {row['triton_graphs_tok_s']:.0f} tok/s; floor "
              f"{row['floor_ms'] or float('nan'):.3f} ms; x{row.get('graphs_over_floor', float('nan')):.2f}")
        sys.stdout.flush()
    os.environ["ROOFTOP_KERNELS"] = "auto"
    for c in [int(x) for x in args.breakdown_at.split(",") if x] or [max_c]:
        profile_step(result, graphs, model, cache, c, pages, args)
    os.environ.pop("ROOFTOP_KERNELS", None)
    write_result(result, args.out, t0)


if __name__ == "__main__":
    main()
