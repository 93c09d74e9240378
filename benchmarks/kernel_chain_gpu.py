"""What does one more kernel cost in a graphed decode step? A chain of dependent reads (GPU)

The engine's graphed decode step is a chain of kernels, each waiting for the one before (330 of them
at 64 sequences in the `small` preset). A kernel that reads B bytes cannot take less than B over the
copy rate, and it cannot take less than the fixed cost of a launch in a graph: the grid's start, the
first DRAM round trip, the tail of its last wave. This measures that curve: for each size B, a chain
of `--chain` kernels, each reading its own B bytes (a slice of one buffer, so a chain past the L2
reads DRAM, as weights do; a chain of small reads stays in the L2, as activations do) and writing one
value, captured in one CUDA graph and replayed.

    python3 benchmarks/kernel_chain_gpu.py [--sizes 0,65536,...] [--chain 64] [--iters 50]
        [--step-preset small --batch 64 --context 288] [--out F]

Prints and writes, per size: microseconds a kernel (median replay over the chain), and the bytes over
that time. The fixed cost is the curve's value at small B.

With --step-preset, one more chain: the engine's graphed decode step at that batch and context as
reads, one kernel per kernel the step launches in that order (at more than 16 sequences: cuBLAS
projections with o_proj's split-K reduce, the shared expert apart; `step_reads` lists them), each
reading the bytes its kernel must read at least (weights, cached rows, activations). Its replay time
is what the step would take were every kernel as fast as a plain read of its bytes: a bound that the
step's kernel count and order put on it, above the roofline floor, which counts bytes only. That chain
reads each byte once a replay, so its small reads come from DRAM where the step's activations sit in
the L2: a little above the bound (summing the size curve at each kernel's bytes gives the other end).
"""

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl
from kernels_gpu import replay_times_ms  # this folder's (run as a script)

from rooftop.provenance import provenance

BLOCK = 8192  # bf16 elements a program reads: 16 KB, one load, as a copy kernel does


@triton.jit
def _read_kernel(src_ptr, out_ptr, n, slot, BLOCK: tl.constexpr):
    """Sum this program's BLOCK elements of src[:n]; program 0 of the grid writes its sum to out[slot]
    (the others' sums are kept from being dropped by a store that never happens: a sum is never NaN
    for finite inputs, so the compiler cannot prove the branch dead)."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src_ptr + offs, mask=offs < n, other=0.0)
    total = tl.sum(x.to(tl.float32), axis=0)
    if (pid == 0) | (total != total):
        tl.store(out_ptr + slot, total)


def _check_first(src: torch.Tensor, out: torch.Tensor, length: int) -> None:
    """The chain's first kernel wrote its program 0's sum: that block's sum, to fp32 rounding."""
    block = src[:min(length, BLOCK)].float()
    off = abs(out[0].item() - block.sum().item())
    if off > 1e-4 * block.abs().sum().item() + 1e-3:
        raise SystemExit(f"chain of {2 * length} B: the first kernel's sum is off by {off}")


def replay_reads(nbytes: list[int], iters: int) -> list[float]:
    """Sorted milliseconds of `iters` replays of one CUDA graph holding a read kernel per entry of
    nbytes, each reading that many bytes of its own slice of one buffer (0: a kernel that reads nothing)."""
    sizes = [max(1, n // 2) if n else 0 for n in nbytes]
    starts, total = [], 0
    for n in sizes:
        starts.append(total)
        total += triton.cdiv(n, BLOCK) * BLOCK
    src = torch.randn(max(total, BLOCK), device="cuda", dtype=torch.bfloat16)
    out = torch.zeros(len(sizes), device="cuda", dtype=torch.float32)

    def run():
        for j, (start, n) in enumerate(zip(starts, sizes, strict=True)):
            _read_kernel[(max(1, triton.cdiv(n, BLOCK)),)](src[start:], out, n, j, BLOCK=BLOCK, num_warps=8)

    run()  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    times = sorted(replay_times_ms(graph.replay, iters))
    _check_first(src, out, sizes[0])
    return times


def chain_us(nbytes: int, chain: int, iters: int) -> tuple[float, float, float]:
    """(median, p10, p90) microseconds a kernel over a graphed chain of `chain` reads of nbytes each."""
    per = [1e3 * t / chain for t in replay_reads([nbytes] * chain, iters)]
    return statistics.median(per), per[len(per) // 10], per[(9 * len(per)) // 10]


def step_reads(c, batch: int, context: int) -> list[tuple[str, int]]:
    """(kernel, bytes it reads at least) for each kernel of the graphed decode step of config `c` at
    `batch` sequences of `context` tokens, in launch order, as the H200 profile lists them past 16
    sequences (bf16 weights and cache; small activations counted; the routed experts' distinct
    experts expected for `batch` tokens drawing top-k uniformly)."""
    b2, h = 2, c.hidden_size
    keys = min(context, c.index_topk)
    act = batch * h * b2
    attn = [
        ("q_a + kv_a + index k + index w", (c.q_lora_rank + c.kv_cache_dim + c.index_head_dim + c.index_n_heads) * h * b2
         + act),
        ("norm, RoPE, cache store", batch * (c.q_lora_rank + c.kv_cache_dim + c.index_head_dim) * b2 * 2),
        ("q_b + index wq_b", (c.num_attention_heads * c.qk_head_dim + c.index_n_heads * c.index_head_dim)
         * c.q_lora_rank * b2),
        ("absorb W_UK", c.num_attention_heads * c.qk_nope_head_dim * c.kv_lora_rank * b2),
        ("RoPE of both queries", batch * (c.num_attention_heads + c.index_n_heads) * c.qk_rope_head_dim * b2 * 2),
        ("indexer scores", batch * context * c.index_head_dim * b2 + batch * c.index_n_heads * c.index_head_dim * b2),
        ("indexer top-k", batch * context * 4),
        ("sparse MLA", batch * keys * c.kv_cache_dim * b2 + batch * c.num_attention_heads * c.kv_cache_dim * b2),
        ("apply W_UV", c.num_attention_heads * c.v_head_dim * c.kv_lora_rank * b2),
        ("o_proj", h * c.num_attention_heads * c.v_head_dim * b2),
        ("o_proj split-K reduce", 4 * batch * h * 4),
        ("residual add + norm", 3 * act),
    ]
    e, k, i = c.n_routed_experts, c.num_experts_per_tok, c.moe_intermediate_size
    distinct = round(e * (1 - (1 - k / e) ** batch))
    shared_i = c.n_shared_experts * i
    moe = [
        ("router", e * h * b2 + act),
        ("pair layout", batch * k * 8),
        ("shared gate + up", 2 * shared_i * h * b2 + act),
        ("shared SiLU * up", batch * shared_i * b2 * 3),
        ("shared down", h * shared_i * b2),
        ("experts gate + up", distinct * 2 * i * h * b2 + act),
        ("experts down", distinct * h * i * b2),
        ("combine + residual + next norm", batch * (k + 2) * h * b2),
    ]
    dense = [
        ("dense gate + up", 2 * c.intermediate_size * h * b2 + act),
        ("dense SiLU * up", batch * c.intermediate_size * b2 * 3),
        ("dense down", h * c.intermediate_size * b2),
        ("residual add + next norm", 3 * act),
    ]
    reads = [("step inputs (embedding, first norm, RoPE)", act)]
    for layer in range(c.num_hidden_layers):
        reads += attn + (dense if layer < c.first_k_dense_replace else moe)
    reads += [("lm_head", c.vocab_size * h * b2 + act)]
    reads += [(f"logits and picks {j}", batch * c.vocab_size * 4) for j in range(12)]
    return reads


def fold_small(reads: list[tuple[str, int]], below: int) -> list[tuple[str, int]]:
    """The reads with each one under `below` bytes merged into the next (a fused kernel reads both)."""
    out, carry = [], 0
    for name, n in reads:
        if n < below:
            carry += n
            continue
        out.append((name, n + carry))
        carry = 0
    if carry:
        out.append(("folded tail", carry))
    return out


def step_chain(reads: list[tuple[str, int]], iters: int) -> dict:
    """Replay a graph of one read a kernel, each its own bytes: median and p10/p90 milliseconds."""
    times = replay_reads([n for _, n in reads], iters)
    return {"kernels": len(reads), "bytes": sum(n for _, n in reads), "ms": statistics.median(times),
            "p10_ms": times[len(times) // 10], "p90_ms": times[(9 * len(times)) // 10]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="0,16384,262144,1048576,4194304,6291456,16777216,33554432,"
                                       "69206016,138412032",
                    help="bytes each kernel reads, comma-separated")
    ap.add_argument("--chain", type=int, default=64, help="kernels in the graph")
    ap.add_argument("--iters", type=int, default=50, help="graph replays timed a size")
    ap.add_argument("--step-preset", default=None, help="also a chain shaped like this preset's decode step")
    ap.add_argument("--batch", type=int, default=64, help="sequences in that step")
    ap.add_argument("--context", type=int, default=288, help="tokens of each sequence in that step")
    ap.add_argument("--fold-below", type=int, default=2 << 20,
                    help="and that chain again with the kernels reading fewer bytes than this folded into the "
                         "next kernel (their bytes kept): the step with its glue fused away")
    ap.add_argument("--out", default="kernel-chain.json")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for nbytes in sizes:
        chain = args.chain if nbytes * args.chain <= (16 << 30) else max(2, (16 << 30) // nbytes)
        med, p10, p90 = chain_us(nbytes, chain, args.iters)
        rows.append({"bytes": nbytes, "chain": chain, "us_per_kernel": med, "p10_us": p10, "p90_us": p90,
                     "tb_s": nbytes / med / 1e6 if nbytes else None})
        tb = f"{rows[-1]['tb_s']:.2f} TB/s" if nbytes else "-"
        print(f"{nbytes / 2**20:9.3f} MiB  {med:8.2f} us/kernel [{p10:.2f}, {p90:.2f}]  {tb}", flush=True)
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "command": "kernel_chain_gpu.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
           "block_elements": BLOCK, "rows": rows}
    if args.step_preset:
        from rooftop.engine.model.config import ModelConfig

        reads = step_reads(ModelConfig.preset(args.step_preset), args.batch, args.context)
        step = step_chain(reads, args.iters)
        copy_ms = step["bytes"] / (rows[-1]["tb_s"] * 1e9) if rows and rows[-1]["tb_s"] else None
        doc["step"] = {"preset": args.step_preset, "batch": args.batch, "context": args.context, **step,
                       "bytes_at_largest_read_rate_ms": copy_ms, "reads": reads}
        folded = step_chain(fold_small(reads, args.fold_below), args.iters)
        doc["step"]["folded_below_bytes"] = args.fold_below
        doc["step"]["folded"] = folded
        for name, row in (("step-shaped chain", step), (f"  glue under {args.fold_below} B folded", folded)):
            print(f"{name}, {args.step_preset} at {args.batch} x {args.context}: {row['kernels']} kernels, "
                  f"{row['bytes'] / 1e9:.3f} GB, {row['ms']:.3f} ms [{row['p10_ms']:.3f}, {row['p90_ms']:.3f}]", flush=True)
        if copy_ms:
            print(f"  those bytes at the largest read's rate: {copy_ms:.3f} ms", flush=True)
    with open(args.out, "w") as f:
        json.dump({"provenance": provenance(), **doc}, f, indent=1)


if __name__ == "__main__":
    main()
