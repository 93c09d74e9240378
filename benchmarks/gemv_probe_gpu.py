"""Where a batch-1 projection's ~6.5 us goes on an H200, and whether a GEMV without tensor cores beats it.

For each of the `small` preset's per-layer projections at one row (as the engine calls them, the
per-head W_UK and W_UV products included), a CUDA graph of `--calls` back-to-back calls, each of:

- matmul: the engine's `triton_matmul` (16-row tl.dot tiles, K pipelined through shared memory);
- gemv BN/W: the register GEMV (`triton_matmul._gemv_kernel`, which this probe's figures chose), one
  program a BLOCK_N-column strip loading its whole K range at once (no shared memory, no pipeline:
  every load in flight from the start), fp32 sums, num_warps W;
- cublas: F.linear / torch.bmm;
- empty: a kernel on matmul's grid that only stores one value a program (launch and scheduling).

Each graph runs twice: over `--calls` distinct weights (more than L2 holds: DRAM) and over one
weight `--calls` times (L2-resident). Rows: replay time a call (CUDA events, median of `--iters`)
and the profiler's mean kernel duration; gemv rows are checked against matmul.

    python3 benchmarks/gemv_probe_gpu.py [--calls 16] [--iters 100] [--out gemv-probe.json]
"""

import argparse
import functools
import json
import statistics

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from kernels_gpu import replay_times_ms  # this folder's (run as a script)

from rooftop.engine.kernels import triton_matmul
from rooftop.engine.model.config import ModelConfig
from rooftop.provenance import provenance


@triton.jit
def _empty_kernel(out_ptr):
    tl.store(out_ptr + tl.program_id(0) + tl.num_programs(0) * tl.program_id(1), 0.0)


def gemv(x: torch.Tensor, w: torch.Tensor, block_n: int, num_warps: int) -> torch.Tensor:
    """x [B, 1, K] @ w [B, K, N] -> [B, 1, N]."""
    nb, _, k = x.shape
    n = w.shape[2]
    out = x.new_empty(nb, 1, n)
    block_k = min(triton.next_power_of_2(k), max(16, (8192 // block_n)))
    triton_matmul._gemv_kernel[(triton.cdiv(n, block_n), nb)](
        x, w, out, n, x.stride(0), w.stride(0), w.stride(1), w.stride(2), out.stride(0),
        K=k, BLOCK_N=block_n, BLOCK_K=block_k, PDL=False, num_warps=num_warps)
    return out


def projections(c: ModelConfig, dev: str):
    """(name, make_weight, x, matmul(x, w), cublas(x, w), as_bmm(w)): one layer's batch-1 products."""
    h = c.num_attention_heads

    def dense(n, k):
        return lambda: torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02

    def kv_b():
        return torch.randn(h, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank, device=dev, dtype=torch.bfloat16) * 0.02

    def row(k):
        return torch.randn(1, k, device=dev, dtype=torch.bfloat16)

    rows = []
    for name, n, k in [("qa_stack", c.q_lora_rank + c.kv_cache_dim + c.index_head_dim + c.index_n_heads, c.hidden_size),
                       ("q_b_stack", h * c.qk_head_dim + c.index_n_heads * c.index_head_dim, c.q_lora_rank),
                       ("o_proj", c.hidden_size, h * c.v_head_dim)]:
        rows.append((name, dense(n, k), row(k), triton_matmul.linear, F.linear, lambda w: w.t()[None],
                     lambda x: x[None]))
    nope = c.qk_nope_head_dim
    q = torch.randn(h, 1, nope, device=dev, dtype=torch.bfloat16)
    lat = torch.randn(h, 1, c.kv_lora_rank, device=dev, dtype=torch.bfloat16)
    rows.append(("w_uk", lambda: kv_b()[:, :nope], q, triton_matmul.bmm, torch.bmm, lambda w: w, lambda x: x))
    rows.append(("w_uv", lambda: kv_b()[:, nope:].transpose(1, 2), lat, triton_matmul.bmm, torch.bmm, lambda w: w,
                 lambda x: x))
    return rows


def time_graph(fn, iters: int) -> tuple[float, float, int]:
    """(replay ms, mean kernel us, kernels a replay) of fn captured in a graph."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = replay_times_ms(g.replay, iters)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return statistics.median(times), sum(e.device_time for e in ev) / max(1, len(ev)), len(ev)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--out", default="gemv-probe.json")
    args = ap.parse_args()
    c = ModelConfig.preset("small")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "calls": args.calls, "rows": []}
    for name, make, x, matmul, cublas, as_bmm, x_bmm in projections(c, "cuda"):
        ws = [make() for _ in range(args.calls)]
        nbytes = ws[0].numel() * 2
        ref = matmul(x, ws[0]).float()
        xb = x_bmm(x)
        k, n = as_bmm(ws[0]).shape[1:]
        variants = {"matmul": functools.partial(matmul, x), "cublas": functools.partial(cublas, x)}
        for bn in (2, 4, 8, 16, 32, 64, 128):
            if bn > n or bn * k * 2 > (96 << 10) or bn * k * 2 < (4 << 10):
                continue
            for nw in (4, 8):
                variants[f"gemv {bn}/{nw}"] = lambda w, bn=bn, nw=nw, xb=xb, as_bmm=as_bmm: gemv(xb, as_bmm(w), bn, nw)
        cfg = triton_matmul.default_config(1, n, k, xb.shape[0])
        grid = (triton.cdiv(n, cfg["BLOCK_N"]), cfg["splits"] * xb.shape[0])
        sink = torch.empty(grid[0] * grid[1], device="cuda")
        variants["empty"] = lambda w, grid=grid, sink=sink: _empty_kernel[grid](sink)
        for vname, fn in variants.items():
            row = {"shape": name, "bytes": nbytes, "variant": vname}
            try:
                if vname.startswith("gemv"):
                    got = fn(ws[0]).reshape(ref.shape).float()
                    row["max_abs_diff_vs_matmul"] = float((got - ref).abs().max())
                for mode, seq in (("dram", ws), ("l2", [ws[0]] * args.calls)):
                    ms, kus, nk = time_graph(lambda seq=seq, fn=fn: [fn(w) for w in seq], args.iters)
                    row[f"{mode}_us_a_call"] = ms * 1e3 / args.calls
                    row[f"{mode}_kernel_us"] = kus
                    row["kernels_a_call"] = nk / args.calls
                row["dram_tb_s"] = nbytes / (row["dram_us_a_call"] * 1e-6) / 1e12
            except Exception as exc:  # noqa: BLE001 - a probe: report what failed and go on
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            print({k2: round(v, 2) if isinstance(v, float) else v for k2, v in row.items()}, flush=True)
            result["rows"].append(row)
    with open(args.out, "w") as f:
        json.dump({"provenance": provenance(), **result}, f, indent=1)


if __name__ == "__main__":
    main()
