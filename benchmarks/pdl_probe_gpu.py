"""Does programmatic dependent launch (PDL) shorten a graphed chain of decode-sized GEMMs? (H200)

A chain of `--layers` x 3 one-row products (2048 -> 768 -> 4096 -> 2048, each reading the last one's
output, like a layer's projections at batch 1), captured in one CUDA graph, four ways:

- plain: the same skinny kernel as the engine's Triton path, launched normally;
- pdl: launched with PDL, each program waits on the previous grid (griddepcontrol.wait) before it
  reads anything, and lets the next grid launch at once (griddepcontrol.launch_dependents);
- pdl+prefetch: as pdl, and before waiting each program asks L2 for its own weight tile's lines
  (weights do not depend on the previous kernel, so their DRAM trip overlaps its tail);
- pdl+early-weights: as pdl, and the first K tile of the weights is loaded into registers before the wait.

    python3 benchmarks/pdl_probe_gpu.py [--layers 32] [--iters 200] [--out pdl-probe.json]

Prints and writes the graph replay time of each, per kernel, and the weights' bytes over that time.
"""

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl
from kernels_gpu import replay_times_ms  # this folder's (run as a script)

from rooftop.provenance import provenance


@triton.jit
def _prefetch_l2(ptrs):
    return tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, out_ptr, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, MODE: tl.constexpr):
    """out[0:1, n tile] = x[0:1] @ W[n tile]^T; W [N, K] row-major (the engine's weight layout)."""
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    m_ok = rm < 1
    w_cols = w_ptr + rn.to(tl.int64)[None, :] * K
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_start = 0
    if MODE == 2:  # L2 prefetch of this program's weight rows (one address per 128-byte line)
        lines = tl.arange(0, 64)
        for k0 in range(0, K, 64 * 64):
            kk = tl.minimum(k0 + lines * 64, K - 1)
            _prefetch_l2(w_ptr + rn.to(tl.int64)[:, None] * K + kk[None, :])
    if MODE == 3:  # the first weight tile into registers before waiting
        rk = tl.arange(0, BLOCK_K)
        b0 = tl.load(w_cols + rk[:, None], mask=n_ok[None, :], other=0.0)
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
        a0 = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=m_ok[:, None], other=0.0)
        acc = tl.dot(a0, b0, acc)
        k_start = BLOCK_K
    elif MODE >= 1:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    for k0 in range(k_start, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=m_ok[:, None], other=0.0)
        b = tl.load(w_cols + rk[:, None], mask=n_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def chain(weights, bufs, mode: int):
    for i, w in enumerate(weights):
        n, k = w.shape
        block_n = 16 if n <= 2048 else 32
        _gemv_kernel[(triton.cdiv(n, block_n),)](bufs[i], w, bufs[i + 1], n, k, BLOCK_M=16, BLOCK_N=block_n,
                                                 BLOCK_K=256, MODE=mode, num_warps=4, num_stages=4,
                                                 launch_pdl=mode >= 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out", default="pdl-probe.json")
    args = ap.parse_args()
    dims = [2048, 768, 4096]
    shapes = [(dims[(i + 1) % 3], dims[i % 3]) for i in range(3 * args.layers)]  # (N, K)
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for n, k in shapes]
    bufs = [torch.randn(16, 2048, device="cuda", dtype=torch.bfloat16)]
    bufs += [torch.empty(16, n, device="cuda", dtype=torch.bfloat16) for n, _ in shapes]
    wbytes = sum(w.numel() * 2 for w in weights)
    names = {0: "plain", 1: "pdl", 2: "pdl+prefetch", 3: "pdl+early-weights"}
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "kernels": len(weights), "weight_bytes": wbytes, "rows": []}
    outs = {}
    for mode, name in names.items():
        row = {"variant": name}
        try:
            chain(weights, bufs, mode)
            torch.cuda.synchronize()
            outs[mode] = bufs[-1][0].float().clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                chain(weights, bufs, mode)
            times = replay_times_ms(graph.replay, args.iters, warmup=10)
            graph.replay()
            torch.cuda.synchronize()
            ms = statistics.median(times)
            row.update(ms=ms, us_per_kernel=ms * 1e3 / len(weights), weight_tb_s=wbytes / ms / 1e9,
                       max_abs_diff_vs_plain=float((bufs[-1][0].float() - outs[0]).abs().max()),
                       p10_ms=sorted(times)[len(times) // 10], p90_ms=sorted(times)[len(times) * 9 // 10])
        except Exception as exc:  # noqa: BLE001 - a probe: report what failed and go on
            row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        print(row, flush=True)
        result["rows"].append(row)
    with open(args.out, "w") as f:
        json.dump({"provenance": provenance(), **result}, f, indent=1)


if __name__ == "__main__":
    main()
