"""Time each Triton kernel of the embedded engine at decode shapes on a GPU, against the measured
device-to-device copy bandwidth. Prints tables and writes JSON.

    python3 benchmarks/kernels_gpu.py [--out kernels-h200.json] [--quick]

Times: CUDA events around each call, after warm-up, the L2 flushed before each by reading a 256 MiB
buffer (`--flush read`: the L2 is left holding clean lines, as after a decode step's weight reads) or
by writing it (`--flush write`, what triton.testing.do_bench does: the L2 is left holding up to 50 MB
of dirty lines that are written back while the timed kernel runs, which costs a 30-100 us kernel
several microseconds; the sparse MLA table reports both); median of --iters. Bytes are what the
kernel must move at least (stated per kernel below).
"""

import argparse
import functools
import importlib
import json
import math
import platform
import statistics
import sys
import time

import torch
import triton

from rooftop.engine.kernels import reference, triton_indexer, triton_moe, triton_sparse_mla
from rooftop.provenance import provenance

DEV = "cuda"
FLUSH = {"mode": "read"}  # --flush
_FLUSH = {}


def flush_l2(mode: str) -> None:
    """Evict the L2 by reading (clean lines left) or writing (dirty lines left) 256 MiB."""
    if not _FLUSH:
        _FLUSH["buf"] = torch.empty(64 << 20, dtype=torch.float32, device=DEV).normal_()
        _FLUSH["sink"] = torch.empty((), dtype=torch.float32, device=DEV)
    if mode == "write":
        _FLUSH["buf"].zero_()
    elif mode == "read":
        torch.sum(_FLUSH["buf"], 0, out=_FLUSH["sink"])
    else:
        raise ValueError(f"flush mode {mode!r}: read or write")


def time_ms(fn, iters: int = 30, warmup: int = 3, graph: bool = True, flush: str | None = None) -> float:
    """Median GPU milliseconds of fn() over `iters` calls, each after an L2 flush (`flush`, or --flush).

    With `graph`, fn is captured in a CUDA graph and replayed (the Triton paths never sync), so the
    time is the GPU's, not Python's launch overhead; the reference MoE syncs, so it runs eagerly.
    """
    mode = flush or FLUSH["mode"]
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    run = fn
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends, strict=True):
        flush_l2(mode)
        s.record()
        run()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def replay_times_ms(fn, iters: int, warmup: int = 5) -> list[float]:
    """CUDA-event milliseconds of `iters` calls of fn() (a graph's replay, or a whole step), one after
    another with no L2 flush between (a chain's steady state, unlike `time_ms`)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return times


def parse_knob(item: str, flag: str = "--set") -> tuple[object, str, object]:
    """'MODULE.NAME=JSON' (an A/B knob: a module constant) -> (the module, NAME, the value); one clear
    error naming `flag` when it is not that or the module has no such constant."""
    target, sep, value = item.partition("=")
    module, _, attr = target.rpartition(".")
    if not sep or not module:
        raise SystemExit(f"{flag} {item!r} is not MODULE.NAME=JSON")
    mod = importlib.import_module(module)
    if not hasattr(mod, attr):
        raise SystemExit(f"{flag} {item!r}: {module} has no {attr}")
    return mod, attr, json.loads(value)


def write_result(result: dict, path: str, t0: float) -> None:
    """Stamp result["wall_s"] (seconds since t0), write it as JSON to path and say so."""
    result["wall_s"] = time.time() - t0
    with open(path, "w") as f:
        json.dump({"provenance": provenance(), **result}, f, indent=1)
    print(f"wrote {path} in {result['wall_s']:.0f} s")


def copy_bandwidth() -> dict:
    """Device-to-device copy of 2 GiB: bytes read + written over time."""
    src = torch.empty(1 << 30, dtype=torch.bfloat16, device=DEV).normal_()
    dst = torch.empty_like(src)
    # Eager: a copy captured in a graph becomes a copy-engine node, slower than the copy kernel.
    ms = time_ms(lambda: dst.copy_(src), iters=20, graph=False)
    moved = 2 * src.numel() * src.element_size()
    return {"bytes": moved, "ms": ms, "bytes_per_s": moved / ms * 1e3}


# ---- sparse MLA ----

def scattered_slots(batch: int, topk: int, cache_tokens: int, window: int = 0) -> torch.Tensor:
    """Slot ids [batch, topk] drawn uniformly over the whole cache (a long context's rows, no L2 reuse
    across queries), or with `window` over each token's own run of that many tokens (its pages)."""
    if not window:
        return torch.randint(0, cache_tokens, (batch, topk), device=DEV)
    if window >= cache_tokens:
        raise ValueError(f"window {window} must be smaller than the cache ({cache_tokens} tokens)")
    base = torch.randint(0, cache_tokens - window, (batch, 1), device=DEV)
    return base + torch.randint(0, window, (batch, topk), device=DEV)


def sparse_mla_bytes(batch: int, heads: int, topk: int, rank: int = 512, rope: int = 64) -> int:
    """What sparse MLA must move at least: the gathered top-k rows, the queries and the outputs (bf16)."""
    width = rank + rope
    return 2 * (batch * topk * width + batch * heads * width + batch * heads * rank)


def bench_sparse_mla(batches, heads_list, topks, rank=512, rope=64, cache_tokens=1 << 22, iters=30,
                     window: int = 0) -> list[dict]:
    """Sparse MLA decode; bytes = gathered top-k rows + queries + outputs (bf16). Slots scattered over
    the whole cache, or with `window` over each token's own run of that many tokens."""
    width = rank + rope
    kv = torch.empty(cache_tokens // 64, 64, width, dtype=torch.bfloat16, device=DEV).normal_()
    rows = []
    for topk in topks:
        for heads in heads_list:
            for batch in batches:
                q = torch.randn(batch, heads, width, device=DEV).bfloat16()
                slots = scattered_slots(batch, topk, cache_tokens, window)
                cfg = triton_sparse_mla.default_config(batch, heads, topk, _sms())
                call = functools.partial(triton_sparse_mla.sparse_mla, q, kv, slots, rank, width**-0.5)
                ms = time_ms(call, iters)
                other = "write" if FLUSH["mode"] == "read" else "read"
                ms_other = time_ms(call, iters, flush=other)
                nbytes = sparse_mla_bytes(batch, heads, topk, rank, rope)
                flops = 2 * batch * heads * topk * (width + rank)
                rows.append({"batch": batch, "heads": heads, "topk": topk, "window": window, "ms": ms, "bytes": nbytes,
                             "flops": flops, "bytes_per_s": nbytes / ms * 1e3, "flops_per_s": flops / ms * 1e3,
                             f"ms_{other}_flush": ms_other, f"bytes_per_s_{other}_flush": nbytes / ms_other * 1e3,
                             "config": cfg})
    return rows


def sparse_tiles(heads: int) -> list[tuple]:
    """Tiles to sweep at a head count: (rows as M, BLOCK_H, BLOCK_N, warps, stages, prefetch), likeliest
    first. With prefetch (slots carried a tile ahead) num_stages - 1 row tiles are in flight in shared
    memory; without, one (Triton's pipeliner spends the stages on the slot loads)."""
    if heads > 32:
        tiles = [(True, 64, 64, w, st, pf) for w in (8, 4) for st in (2, 3) for pf in (False, True)]
        # Heads as M, 64 a tile: warpgroup MMA over the heads (the latent read once per 64 heads).
        tiles += [(False, 64, n, w, st, True) for n in (32, 64) for w in (8, 4) for st in (2, 3)]
        return tiles + [(True, 64, 32, 8, 3, True), (True, 128, 64, 8, 2, False)]
    bh = max(16, triton.next_power_of_2(heads))
    tiles = [(False, bh, 32, 4, 3, True), (False, bh, 16, 2, 3, True), (False, bh, 64, 4, 2, True)]
    tiles += [(False, bh, 32, 4, 4, True), (False, bh, 32, 8, 3, True)]
    # The defaults before the prefetch: 16 heads (from 64 tokens), 32 heads (up to 64 tokens).
    tiles += [(False, bh, 32, 4, 4, False), (True, bh, 64, 4, 2, False)]
    return tiles


def gather_ceiling(cases, rank=512, rope=64, cache_tokens=1 << 22, iters=20) -> list[dict]:
    """torch.index_select of the same scattered rows into a dense tensor: bytes read + written.

    A tuned gather of this access pattern (1152-byte rows at random) as a reference for how near the
    copy rate such reads can come; `window` draws each token's slots from its own run of that many
    tokens (a context's pages) instead of the whole cache.
    """
    width = rank + rope
    kv = torch.empty(cache_tokens, width, dtype=torch.bfloat16, device=DEV).normal_()
    rows = []
    for batch, topk, window in cases:
        flat = scattered_slots(batch, topk, cache_tokens, window).flatten()
        out = torch.empty(flat.numel(), width, dtype=torch.bfloat16, device=DEV)
        ms = time_ms(lambda f=flat, o=out: torch.index_select(kv, 0, f, out=o), iters)
        nbytes = 2 * flat.numel() * width * 2
        rows.append({"batch": batch, "topk": topk, "window": window, "ms": ms, "bytes": nbytes,
                     "bytes_per_s": nbytes / ms * 1e3})
    return rows


SWEEP_SPLITS = (1, 2, 3, 4, 6, 8, 16)


def sweep_sparse_mla(shapes, rank=512, rope=64, cache_tokens=1 << 22, iters=20, budget_s=180.0) -> list[dict]:
    """Tile and split choices at (batch, heads, topk) shapes, within a time budget (compiles dominate)."""
    width = rank + rope
    kv = torch.empty(cache_tokens // 64, 64, width, dtype=torch.bfloat16, device=DEV).normal_()
    out = []
    t0 = time.time()
    for batch, heads, topk in shapes:
        q = torch.randn(batch, heads, width, device=DEV).bfloat16()
        slots = scattered_slots(batch, topk, cache_tokens)
        nbytes = sparse_mla_bytes(batch, heads, topk, rank, rope)
        for rows_as_m, block_h, block_n, warps, stages, prefetch in sparse_tiles(heads):
            for splits in SWEEP_SPLITS if heads <= 32 else (1, 2, 4):
                if time.time() - t0 > budget_s:
                    return out
                cfg = {"BLOCK_H": block_h, "BLOCK_N": block_n, "splits": splits, "num_warps": warps,
                       "num_stages": stages, "rows_as_m": rows_as_m, "prefetch": prefetch}
                row = {"batch": batch, "heads": heads, "topk": topk, "config": cfg}
                try:
                    ms = time_ms(lambda c=cfg, q=q, s=slots: triton_sparse_mla.sparse_mla(q, kv, s, rank, width**-0.5, c), iters)
                except Exception as e:  # out of shared memory or registers for this tile: skip it
                    out.append({**row, "error": type(e).__name__})
                    continue
                flops = 2 * batch * heads * topk * (width + rank)
                out.append({**row, "ms": ms, "bytes_per_s": nbytes / ms * 1e3, "flops_per_s": flops / ms * 1e3})
    return out


def best_tiles(sweep: list[dict], copy_bytes_per_s: float) -> list[dict]:
    """The fastest config of each swept shape, with its share of the copy bandwidth."""
    best: dict[tuple, dict] = {}
    for r in sweep:
        key = (r["batch"], r["heads"], r["topk"])
        if "ms" in r and (key not in best or r["ms"] < best[key]["ms"]):
            best[key] = r
    return [{**r, "fraction_of_copy": r["bytes_per_s"] / copy_bytes_per_s} for r in best.values()]


# ---- indexer ----

def _indexer_inputs(batch, heads, dim, length, capacity_pages, block=64):
    pages = math.ceil(length / block)
    kc = torch.empty(batch * pages + 1, block, dim, dtype=torch.bfloat16, device=DEV).normal_()
    tables = torch.full((batch, capacity_pages), -1, dtype=torch.int32, device=DEV)
    tables[:, :pages] = (torch.randperm(batch * pages, device=DEV) + 1).view(batch, pages).int()
    q = torch.randn(batch, heads, dim, device=DEV).bfloat16()
    w = torch.randn(batch, heads, device=DEV).bfloat16()
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device=DEV)
    return q, w, kc, tables, seq_lens


def bench_indexer(cases, heads=64, dim=128, topk=2048, iters=30, with_reference=True) -> list[dict]:
    """Decode indexer at (batch, actual length, capacity tokens); bytes = the keys scored (bf16)."""
    rows = []
    for batch, length, capacity in cases:
        cap_pages = math.ceil(capacity / 64)
        args = (*_indexer_inputs(batch, heads, dim, length, cap_pages), cap_pages, topk)
        ms = time_ms(lambda a=args: triton_indexer.indexer_topk_decode(*a), iters)
        row = {"batch": batch, "length": length, "capacity": capacity, "heads": heads, "topk": topk, "ms": ms,
               "bytes": 2 * batch * length * dim, "flops": 2 * batch * length * heads * dim}
        row["bytes_per_s"] = row["bytes"] / ms * 1e3
        row["flops_per_s"] = row["flops"] / ms * 1e3
        if with_reference:  # the torch capacity-bound fallback, for contrast
            row["reference_capacity_ms"] = time_ms(
                lambda a=args: reference.indexer_topk_decode(*a), max(5, iters // 5))
        rows.append(row)
    return rows


# ---- MoE ----

def bench_moe(tokens_list, hidden, inter, experts, top_k, iters=30) -> list[dict]:
    """Routed experts; bytes = weights of the distinct experts touched + activations in and out."""
    w13 = (torch.empty(experts, 2 * inter, hidden, device=DEV).normal_() * hidden**-0.5).bfloat16()
    w2 = (torch.empty(experts, hidden, inter, device=DEV).normal_() * inter**-0.5).bfloat16()
    rows = []
    for tokens in tokens_list:
        x = torch.randn(tokens, hidden, device=DEV).bfloat16()
        ids = torch.rand(tokens, experts, device=DEV).argsort(-1)[:, :top_k]
        wts = torch.rand(tokens, top_k, device=DEV)
        distinct = int(ids.unique().numel())
        ms = time_ms(lambda x=x, i=ids, t=wts: triton_moe.moe_experts(x, i, t, w13, w2), iters)
        ref_ms = time_ms(lambda x=x, i=ids, t=wts: reference.moe_experts(x, i, t, w13, w2), max(5, iters // 3),
                         graph=False)
        nbytes = distinct * 3 * hidden * inter * 2 + tokens * hidden * 2 * 2
        flops = 2 * tokens * top_k * 3 * hidden * inter
        rows.append({"tokens": tokens, "hidden": hidden, "inter": inter, "experts": experts, "top_k": top_k,
                     "distinct": distinct, "ms": ms, "reference_ms": ref_ms, "bytes": nbytes, "flops": flops,
                     "bytes_per_s": nbytes / ms * 1e3, "flops_per_s": flops / ms * 1e3})
    return rows


def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def _print_table(title: str, rows: list[dict], keys: list[str]) -> None:
    print(f"\n## {title}")
    print(" | ".join(keys))
    for r in rows:
        cells = []
        for k in keys:
            v = r.get(k, "")
            if k.endswith("bytes_per_s"):
                v = f"{v / 1e12:.2f} TB/s" if v != "" else ""
            elif k.endswith("flops_per_s"):
                v = f"{v / 1e12:.1f} TF/s" if v != "" else ""
            elif (k.endswith("ms") or k.startswith("ms_")) and v != "":
                v = f"{v * 1e3:.1f} us"
            cells.append(str(v))
        print(" | ".join(cells))
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="kernels-gpu.json")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--sweep-budget-s", type=float, default=180.0, help="time for the sparse MLA tile sweep")
    ap.add_argument("--skip-moe", action="store_true", help="leave out the MoE table")
    ap.add_argument("--skip-indexer", action="store_true", help="leave out the indexer table")
    ap.add_argument("--flush", choices=["read", "write"], default="read",
                    help="evict the L2 before each timed call by reading (default) or writing 256 MiB")
    ap.add_argument("--sweep-shapes", default="128x16,32x16,64x16,128x32,32x32,64x32",
                    help="BATCHxHEADS shapes (top-k 2048) of the tile sweep")
    ap.add_argument("--sweep-only", action="store_true", help="only the copy rate and the tile sweep")
    args = ap.parse_args()
    FLUSH["mode"] = args.flush
    t0 = time.time()
    result = {"device": torch.cuda.get_device_name(0), "sms": _sms(), "torch": torch.__version__,
              "python": platform.python_version(), "command": " ".join(sys.argv), "flush": args.flush}
    result["triton"] = triton.__version__
    copy = copy_bandwidth()
    result["copy"] = copy
    print(f"device-to-device copy: {copy['bytes_per_s'] / 1e12:.2f} TB/s (read + written)")

    shapes = [(int(b), int(h), 2048) for b, h in (x.split("x") for x in args.sweep_shapes.split(",") if x)]
    if args.sweep_only:
        sweep(result, shapes, args.sweep_budget_s, copy["bytes_per_s"])
        finish(result, args.out, t0)
        return

    gather = gather_ceiling([(b, 2048, w) for b in (32, 128) for w in (0, 131072)])
    for r in gather:
        r["fraction_of_copy"] = r["bytes_per_s"] / copy["bytes_per_s"]
    result["gather_ceiling"] = gather
    _print_table("gather of the same rows by torch.index_select (read + written)", gather,
                 ["batch", "topk", "window", "ms", "bytes_per_s", "fraction_of_copy"])

    batches = [1, 8, 32, 64, 128] if not args.quick else [1, 32, 64, 128]
    heads = [16, 32, 64, 128] if not args.quick else [16, 32, 128]
    mla = bench_sparse_mla(batches, heads, [512, 2048])
    mla += bench_sparse_mla([32, 64, 128], [16, 32], [2048], window=131072)
    other = "write" if args.flush == "read" else "read"
    for r in mla:
        r["fraction_of_copy"] = r["bytes_per_s"] / copy["bytes_per_s"]
        r[f"fraction_of_copy_{other}_flush"] = r[f"bytes_per_s_{other}_flush"] / copy["bytes_per_s"]
    result["sparse_mla"] = mla
    _print_table(f"sparse MLA decode (rank 512 + rope 64, bf16; window 0 = slots over the whole 4M-token cache; "
                 f"L2 flushed by a {args.flush}, and by a {other})", mla,
                 ["batch", "heads", "topk", "window", "ms", "bytes_per_s", "flops_per_s", "fraction_of_copy",
                  f"ms_{other}_flush", f"fraction_of_copy_{other}_flush"])
    sweep(result, shapes, args.sweep_budget_s, copy["bytes_per_s"])

    if not args.skip_indexer:
        cases = [(b, 512, cap) for b in (1, 32, 64) for cap in (8192, 262144)]
        cases += [(1, n, 131072) for n in (4096, 32768, 131072)] + [(32, n, 131072) for n in (4096, 32768)]
        idx = bench_indexer(cases)
        result["indexer"] = idx
        _print_table("decode indexer (64 heads x 128, top-k 2048): Triton vs torch capacity fallback", idx,
                     ["batch", "length", "capacity", "ms", "reference_capacity_ms", "bytes_per_s", "flops_per_s"])
        by = {(r["batch"], r["capacity"]): r["ms"] for r in idx if r["length"] == 512}
        result["indexer_capacity_ratio"] = {str(b): by[(b, 262144)] / by[(b, 8192)] for b in (1, 32, 64)}
        print("indexer time at length 512, capacity 262144 / 8192:", result["indexer_capacity_ratio"])

    moe = [] if args.skip_moe else bench_moe([1, 16, 64, 128], 2048, 512, 32, 4)
    moe += [] if args.skip_moe else bench_moe([1, 16, 64, 128], 7168, 2048, 256, 8, iters=10)
    result["moe"] = moe
    _print_table("routed experts (grouped GEMM) vs reference loop", moe,
                 ["tokens", "hidden", "experts", "top_k", "distinct", "ms", "reference_ms", "bytes_per_s",
                  "flops_per_s"])
    finish(result, args.out, t0)


def sweep(result: dict, shapes: list[tuple], budget_s: float, copy_bytes_per_s: float) -> None:
    """The sparse MLA tile sweep at `shapes`, and the best tile of each, into `result`."""
    result["sparse_mla_sweep"] = sweep_sparse_mla(shapes, budget_s=budget_s)
    result["sparse_mla_best"] = best_tiles(result["sparse_mla_sweep"], copy_bytes_per_s)
    _print_table("sparse MLA: best tile per shape (top-k 2048)", result["sparse_mla_best"],
                 ["batch", "heads", "config", "ms", "bytes_per_s", "flops_per_s", "fraction_of_copy"])


def finish(result: dict, out: str, t0: float) -> None:
    result["wall_s"] = time.time() - t0
    with open(out, "w") as f:
        json.dump({"provenance": provenance(), **result}, f, indent=1, default=str)
    print(f"\nwrote {out} in {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
