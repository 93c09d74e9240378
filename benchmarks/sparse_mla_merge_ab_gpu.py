"""Sparse MLA's split merge in-kernel (the last split merges) against the merge kernel, A/B on one GPU.

At each shape the default tile runs with `MERGE_IN_KERNEL_BYTES` at its default and at 0 (always the
second kernel), alternating for `--rounds` rounds of `--iters` graph replays each, L2 flushed
before each replay (kernels_gpu.time_ms). Reports each arm's median over rounds, the rounds' spread,
and the share of the copy rate (kernels_gpu.sparse_mla_bytes over the time).

    python3 benchmarks/sparse_mla_merge_ab_gpu.py [--shapes 64x16,128x16] [--rounds 8] [--out F.json]
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels_gpu import DEV, copy_bandwidth, scattered_slots, sparse_mla_bytes, time_ms  # noqa: E402

from rooftop.engine.kernels import triton_sparse_mla  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="64x16,128x16", help="BATCHxHEADS, top-k 2048")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--out", default="sparse-mla-merge-ab.json")
    args = ap.parse_args()
    rank, rope, topk, cache_tokens = 512, 64, 2048, 1 << 22
    width = rank + rope
    kv = torch.empty(cache_tokens // 64, 64, width, dtype=torch.bfloat16, device=DEV).normal_()
    copy = copy_bandwidth()
    default_bytes = triton_sparse_mla.MERGE_IN_KERNEL_BYTES
    result = {"device": torch.cuda.get_device_name(), "command": " ".join(sys.argv), "copy": copy, "rows": []}
    for shape in args.shapes.split(","):
        batch, heads = (int(v) for v in shape.split("x"))
        q = torch.randn(batch, heads, width, device=DEV).bfloat16()
        slots = scattered_slots(batch, topk, cache_tokens)
        cfg = triton_sparse_mla.default_config(batch, heads, topk)
        times = {"in_kernel": [], "merge_kernel": []}
        for _ in range(args.rounds):
            for arm, merge_bytes in (("in_kernel", default_bytes), ("merge_kernel", 0)):
                triton_sparse_mla.MERGE_IN_KERNEL_BYTES = merge_bytes
                times[arm].append(time_ms(lambda q=q, s=slots: triton_sparse_mla.sparse_mla(q, kv, s, rank, width**-0.5),
                                          args.iters, flush="read"))
        triton_sparse_mla.MERGE_IN_KERNEL_BYTES = default_bytes
        nbytes = sparse_mla_bytes(batch, heads, topk, rank, rope)
        row = {"batch": batch, "heads": heads, "topk": topk, "config": cfg,
               "merges_in_kernel": triton_sparse_mla.merges_in_kernel(cfg, rank)}
        for arm, ts in times.items():
            med = statistics.median(ts)
            row[arm] = {"ms_rounds": ts, "ms_median": med, "ms_min": min(ts), "ms_max": max(ts),
                        "fraction_of_copy": nbytes / med * 1e3 / copy["bytes_per_s"]}
        result["rows"].append(row)
        print(f"{batch}x{heads} {cfg['splits']} splits: in-kernel {row['in_kernel']['ms_median'] * 1e3:.1f} us "
              f"[{row['in_kernel']['ms_min'] * 1e3:.1f}, {row['in_kernel']['ms_max'] * 1e3:.1f}] "
              f"({row['in_kernel']['fraction_of_copy']:.1%} of copy); merge kernel "
              f"{row['merge_kernel']['ms_median'] * 1e3:.1f} us [{row['merge_kernel']['ms_min'] * 1e3:.1f}, "
              f"{row['merge_kernel']['ms_max'] * 1e3:.1f}] ({row['merge_kernel']['fraction_of_copy']:.1%})", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
