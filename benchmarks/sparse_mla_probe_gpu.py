"""Where the sparse-MLA decode kernel's time goes at batch 32-128 on a GPU, by difference.

    python3 benchmarks/sparse_mla_probe_gpu.py [--parts copy,breakdown,tiles] [--budget-s 240]
                                               [--out sparse-mla-probe.json]

For 16 and 32 heads, top-k 2048, each row is one variant timed as in kernels_gpu.py (graph replays,
median), with the L2 flushed before each replay in one of two ways:

- `write`: zero a 256 MiB buffer (as triton.testing.do_bench does, and kernels_gpu.py --flush write).
  The L2 is left holding up to its size (50 MB on the H200) of dirty lines, written back while the
  kernel reads.
- `read`: sum a 256 MiB buffer (kernels_gpu.py's default). The L2 is left holding clean lines, as
  after a decode step's weight reads, which is what precedes this kernel in the engine.

Parts: `copy`, device copies at the kernel's own sizes; `breakdown`, the shipped kernel (split
kernel + combine kernel), the split kernel alone (combine skipped: output wrong, time right), a
gather kernel with the same grid, tiles and pipelining but no scores or softmax (each tile summed
through one `tl.dot`), and a contiguous read of the same bytes by `torch.sum` (a slow reduction,
not a ceiling); `tiles`, other tiles and split counts within --budget-s. The probe kernel of 9ba7ce9
(the latent part in 2 or 4 column blocks) lived here at d889f3d; its figures are in
docs/perf/sparse-mla-probe-h200.json.
"""

import argparse
import functools
import json
import platform
import sys
import time

import torch
import triton
import triton.language as tl
from kernels_gpu import (  # this folder's (run as a script, benchmarks/ is on the path)
    sparse_mla_bytes,
    time_ms,
)

from rooftop.engine.kernels import triton_sparse_mla
from rooftop.provenance import provenance

DEV = "cuda"
RANK, ROPE = 512, 64
WIDTH = RANK + ROPE
CACHE_TOKENS = 1 << 22


def time_us(fn, mode: str, iters: int = 25, graph: bool = True) -> float:
    """Median µs of fn() over graph replays, the L2 flushed by a `mode` ("read"/"write") before each."""
    return 1e3 * time_ms(fn, iters, graph=graph, flush=mode)


@triton.jit
def _gather_dot_kernel(kv_ptr, slots_ptr, out_ptr, topk, keys_per_split, num_splits,
                       BLOCK_N: tl.constexpr, DV: tl.constexpr, DR: tl.constexpr, PREFETCH: tl.constexpr):
    """The split kernel's loads and its P.V dot, without Q.K, softmax or rescaling."""
    token = tl.program_id(0)
    split = tl.program_id(1)
    k_lo = split * keys_per_split
    k_hi = tl.minimum(k_lo + keys_per_split, topk)
    dv = tl.arange(0, DV)
    dr = tl.arange(0, DR)
    ones = tl.full([16, BLOCK_N], 1.0, tl.bfloat16)
    acc = tl.zeros([16, DV], tl.float32)
    acc_r = tl.zeros([16, DR], tl.float32)
    slots_row = slots_ptr + token * topk
    n0 = k_lo + tl.arange(0, BLOCK_N)
    slot_next = tl.load(slots_row + n0, mask=n0 < k_hi, other=-1)
    for start in range(k_lo, k_hi, BLOCK_N):
        if PREFETCH:
            slot = slot_next
            n = start + BLOCK_N + tl.arange(0, BLOCK_N)
            slot_next = tl.load(slots_row + n, mask=n < k_hi, other=-1)
        else:
            n = start + tl.arange(0, BLOCK_N)
            slot = tl.load(slots_row + n, mask=n < k_hi, other=-1)
        valid = slot >= 0
        rows = kv_ptr + slot.to(tl.int64)[:, None] * (DV + DR)
        kv = tl.load(rows + dv[None, :], mask=valid[:, None], other=0.0)
        kr = tl.load(rows + DV + dr[None, :], mask=valid[:, None], other=0.0)
        acc += tl.dot(ones, kv)
        acc_r += tl.dot(ones, kr)
    base = (token * num_splits + split) * (DV + DR)
    tl.store(out_ptr + base + dv, tl.sum(acc, axis=0))
    tl.store(out_ptr + base + DV + dr, tl.sum(acc_r, axis=0))


def gather_dot(kv, slots, cfg, out):
    batch, topk = slots.shape
    splits, block_n = cfg["splits"], cfg["BLOCK_N"]
    per = triton.cdiv(triton.cdiv(topk, splits), block_n) * block_n
    _gather_dot_kernel[(batch, splits)](kv, slots, out, topk, per, splits, BLOCK_N=block_n, DV=RANK, DR=ROPE,
                                        PREFETCH=cfg.get("prefetch", False), num_warps=cfg["num_warps"],
                                        num_stages=cfg["num_stages"])


class _SkipCombine:
    def __getitem__(self, grid):
        return lambda *a, **k: None


def copy_rates(res, add, nbytes) -> float:
    """Device copies (eager: captured, a copy becomes a slower copy-engine node) of 2 GiB and of the
    sizes the kernel moves at batch 32, 64 and 128 with 16 heads; returns the 2 GiB rate in TB/s."""
    for batch in (0, 32, 64, 128):
        size = (1 << 31) if batch == 0 else nbytes(batch, 16)
        src = torch.empty(size // 4, dtype=torch.bfloat16, device=DEV).normal_()
        dst = torch.empty_like(src)
        for mode in ("write", "read"):
            us = time_us(functools.partial(dst.copy_, src), mode, iters=15, graph=False)
            add({"batch": batch, "flush": mode, "variant": f"copy of {size / 1e6:.0f} MB", "us": us, "bytes": size})
        del src, dst
    big = [r for r in res["rows"] if r["batch"] == 0 and r["flush"] == "write"][0]
    return big["tb_s"]


def breakdown(res, add, nbytes, kv, scale) -> None:
    combine = triton_sparse_mla._sparse_mla_combine_kernel
    for heads in (16, 32):
        for batch in (32, 64, 128):
            q = torch.randn(batch, heads, WIDTH, device=DEV).bfloat16()
            slots = torch.randint(0, CACHE_TOKENS, (batch, 2048), device=DEV)
            base = triton_sparse_mla.default_config(batch, heads, 2048)
            common = {"batch": batch, "heads": heads, "bytes": nbytes(batch, heads)}
            for mode in ("write", "read"):
                us = time_us(functools.partial(triton_sparse_mla.sparse_mla, q, kv, slots, RANK, scale, base), mode)
                add({**common, "flush": mode, "variant": "shipped", "us": us, "config": base})
                triton_sparse_mla._sparse_mla_combine_kernel = _SkipCombine()
                try:
                    us = time_us(functools.partial(triton_sparse_mla.sparse_mla, q, kv, slots, RANK, scale, base),
                                 mode)
                finally:
                    triton_sparse_mla._sparse_mla_combine_kernel = combine
                add({**common, "flush": mode, "variant": "split kernel only", "us": us, "config": base})
                out = torch.empty(batch * base["splits"] * WIDTH, dtype=torch.float32, device=DEV)
                us = time_us(functools.partial(gather_dot, kv, slots, base, out), mode)
                add({**common, "flush": mode, "variant": "gather + P.V dot only", "us": us, "config": base})
                flat = torch.empty(batch * 2048 * WIDTH, dtype=torch.bfloat16, device=DEV).normal_()
                sink = torch.empty((), dtype=torch.float32, device=DEV)
                us = time_us(functools.partial(torch.sum, flat, 0, dtype=torch.float32, out=sink), mode)
                add({**common, "flush": mode, "variant": "contiguous read (torch.sum)", "us": us})
                del flat


TILES = [  # rows as M, BLOCK_N, warps, stages, prefetch
    (False, 32, 4, 3, True), (False, 64, 8, 3, True), (False, 64, 4, 3, True), (False, 16, 2, 3, True),
    (True, 64, 8, 2, False),
]


def tiles(res, add, nbytes, kv, scale, deadline) -> None:
    for heads in (16, 32):
        for batch in (32, 64, 128):
            q = torch.randn(batch, heads, WIDTH, device=DEV).bfloat16()
            slots = torch.randint(0, CACHE_TOKENS, (batch, 2048), device=DEV)
            common = {"batch": batch, "heads": heads, "bytes": nbytes(batch, heads)}
            for rows_as_m, block_n, warps, stages, prefetch in TILES:
                for splits in (1, 2, 4, 8, 16):
                    if time.time() > deadline:
                        return
                    cfg = {"BLOCK_H": 16 if heads <= 16 else 32, "BLOCK_N": block_n, "num_warps": warps,
                           "num_stages": stages, "rows_as_m": rows_as_m, "prefetch": prefetch, "splits": splits}
                    fn = functools.partial(triton_sparse_mla.sparse_mla, q, kv, slots, RANK, scale, cfg)
                    try:
                        for mode in ("read", "write"):
                            add({**common, "flush": mode, "variant": "tile", "us": time_us(fn, mode),
                                 "config": cfg})
                    except Exception as e:  # out of shared memory or registers: skip it
                        res["rows"].append({**common, "variant": "tile", "config": cfg, "error": type(e).__name__})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="sparse-mla-probe.json")
    ap.add_argument("--budget-s", type=float, default=240.0, help="time for the tile sweep")
    ap.add_argument("--parts", default="copy,breakdown,tiles", help="which tables: copy, breakdown, tiles")
    args = ap.parse_args()
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version(), "command": " ".join(sys.argv), "rows": []}
    parts = set(args.parts.split(","))
    copy = 4.28  # TB/s, the H200's 2 GiB copy (kernels-h200.json); `copy` below measures it again
    kv = torch.empty(CACHE_TOKENS // 64, 64, WIDTH, dtype=torch.bfloat16, device=DEV).normal_()
    scale = WIDTH**-0.5

    def add(row):
        row["tb_s"] = row["bytes"] / row["us"] * 1e-6
        row["fraction_of_copy"] = row["tb_s"] / copy
        res["rows"].append(row)
        print(f"{row['batch']:4d} {row.get('heads', 0):3d} {row['flush']:5s} {row['variant']:28s} {row['us']:7.1f} us "
              f"{row['fraction_of_copy'] * 100:5.1f}%  {row.get('config', '')}")
        sys.stdout.flush()

    def nbytes(batch, heads):
        return sparse_mla_bytes(batch, heads, 2048, RANK, ROPE)

    if "copy" in parts:
        copy = copy_rates(res, add, nbytes)
    if "breakdown" in parts:
        breakdown(res, add, nbytes, kv, scale)
    if "tiles" in parts:
        tiles(res, add, nbytes, kv, scale, t0 + args.budget_s)
    res["wall_s"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump({"provenance": provenance(), **res}, f, indent=1)
    print(f"wrote {args.out} in {res['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
