"""Does asking L2 for the next product's weight shorten a graphed chain of batch-1 projections? (H200)

The `small` preset's per-layer projections at one row, `--layers` times over (fresh weights each
layer, so the chain reads ~47 MB a layer from DRAM like the engine's C=1 step), through the engine's
`triton_matmul` kernel, captured in one CUDA graph:

- plain: no prefetch;
- next@start: each product's programs first bulk-prefetch the next product's weight into L2
  (`l2_prefetch`, cp.async.bulk.prefetch.L2), then run as before;
- next@end: the same, issued after the product's own K loop;
- resident: one layer's weights reused by every layer (they stay in L2): what a perfect prefetch
  could give at most.

    python3 benchmarks/l2_prefetch_probe_gpu.py [--layers 16] [--iters 200] [--rounds 3] [--out F.json]

Variants alternate round by round; each row is a median over graph replays (CUDA events), with the
profiler's kernel sum of one replay, and the results are checked equal to plain's.
"""

import argparse
import json
import statistics

import torch
import triton

from rooftop.engine.kernels import triton_matmul
from rooftop.engine.model.config import ModelConfig


def layer_weights(c: ModelConfig, dev: str) -> list[tuple[str, torch.Tensor]]:
    """One layer's projection weights in the order a decode step reads them (as the model stacks them)."""
    h = c.num_attention_heads
    shapes = [
        ("qa_stack", (c.q_lora_rank + c.kv_cache_dim + c.index_head_dim + c.index_n_heads, c.hidden_size)),
        ("q_b_stack", (h * c.qk_head_dim + c.index_n_heads * c.index_head_dim, c.q_lora_rank)),
        ("w_uk", (h, c.qk_nope_head_dim, c.kv_lora_rank)),
        ("w_uv", (h, c.kv_lora_rank, c.v_head_dim)),
        ("o_proj", (c.hidden_size, h * c.v_head_dim)),
    ]
    return [(name, torch.randn(*shape, device=dev, dtype=torch.bfloat16) * 0.02) for name, shape in shapes]


def run_chain(steps, xs, outs, prefetch: bool):
    for i, (name, w) in enumerate(steps):
        nxt = steps[i + 1][1] if prefetch and i + 1 < len(steps) else None
        if w.dim() == 3:
            outs[i] = triton_matmul.bmm(xs[name], w, prefetch=nxt)
        else:
            outs[i] = triton_matmul.linear(xs[name], w, prefetch=nxt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="l2-prefetch-probe.json")
    args = ap.parse_args()
    c = ModelConfig.preset("small")
    dev = "cuda"
    layers = [layer_weights(c, dev) for _ in range(args.layers)]
    steps = [s for layer in layers for s in layer]
    resident = [s for _ in range(args.layers) for s in layers[0]]
    h = c.num_attention_heads
    xs = {"qa_stack": torch.randn(1, c.hidden_size, device=dev, dtype=torch.bfloat16),
          "q_b_stack": torch.randn(1, c.q_lora_rank, device=dev, dtype=torch.bfloat16),
          "w_uk": torch.randn(h, 1, c.qk_nope_head_dim, device=dev, dtype=torch.bfloat16),
          "w_uv": torch.randn(h, 1, c.kv_lora_rank, device=dev, dtype=torch.bfloat16),
          "o_proj": torch.randn(1, h * c.v_head_dim, device=dev, dtype=torch.bfloat16)}
    variants = {"plain": (steps, False, "start"), "next@start": (steps, True, "start"),
                "next@end": (steps, True, "end"), "resident": (resident, False, "start")}
    wbytes = sum(w.numel() * 2 for _, w in steps)
    graphs, outs, ref = {}, {}, None
    for name, (chain, pf, at) in variants.items():
        triton_matmul.PREFETCH_AT = at
        o = [None] * len(chain)
        run_chain(chain, xs, o, pf)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run_chain(chain, xs, o, pf)
        graphs[name], outs[name] = g, o
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "kernels": len(steps), "weight_bytes": wbytes, "rounds": []}
    for r in range(args.rounds):
        for name, g in graphs.items():
            for _ in range(10):
                g.replay()
            times = []
            for _ in range(args.iters):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                g.replay()
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e))
            ms = statistics.median(times)
            row = {"round": r, "variant": name, "ms": ms, "us_per_kernel": ms * 1e3 / len(steps),
                   "weight_tb_s": wbytes / ms / 1e9, "p10_ms": sorted(times)[len(times) // 10],
                   "p90_ms": sorted(times)[len(times) * 9 // 10]}
            if r == 0:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    g.replay()
                    torch.cuda.synchronize()
                ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
                row["kernel_us"] = sum(e.device_time for e in ev)
                row["kernels"] = len(ev)
                if name != "resident":
                    diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(outs[name], outs["plain"]))
                    row["max_abs_diff_vs_plain"] = diff
            print(row, flush=True)
            result["rounds"].append(row)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
