"""Sparse MLA's split merge, A/B on one GPU: partials' dtype, and in-kernel (the last split merges)
against the merge kernel.

Each arm sets `PARTIAL_DTYPE` and `MERGE_IN_KERNEL_BYTES` (`--arms NAME:DTYPE:BYTES,...`; fp32 partials
merge in-kernel up to half of BYTES; the default compares fp32 and 16-bit partials, each with the
merge kernel and in-kernel, at two limits). `--valid-len N` gives every token N valid slots (the
engine's call at a context of N; default: all top-k valid, no lengths passed). At
each shape the default tile runs every arm in turn for `--rounds` rounds of `--iters` graph replays
each, L2 flushed before each replay (kernels_gpu.time_ms). Reports each arm's median over rounds, the
rounds' spread, and the share of the copy rate (kernels_gpu.sparse_mla_bytes over the time).

    python3 benchmarks/sparse_mla_merge_ab_gpu.py [--shapes 64x16,128x16] [--rounds 8] [--arms ...] [--out F.json]
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
from rooftop.provenance import provenance  # noqa: E402

DEFAULT_ARMS = ("fp32-kernel:float32:0,fp32-in64:float32:131072,fp32-in128:float32:262144,"
                "out-kernel:output:0,out-in64:output:65536,out-in128:output:131072")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="64x16,128x16", help="BATCHxHEADS, top-k 2048")
    ap.add_argument("--arms", default=DEFAULT_ARMS, help="NAME:PARTIAL_DTYPE:MERGE_IN_KERNEL_BYTES,...")
    ap.add_argument("--valid-len", type=int, default=0, help="valid slots a token (0: all, no lengths passed)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--out", default="sparse-mla-merge-ab.json")
    args = ap.parse_args()
    arms = [(name, dtype, int(nbytes)) for name, dtype, nbytes in (a.split(":") for a in args.arms.split(","))]
    rank, rope, topk, cache_tokens = 512, 64, 2048, 1 << 22
    width = rank + rope
    kv = torch.empty(cache_tokens // 64, 64, width, dtype=torch.bfloat16, device=DEV).normal_()
    copy = copy_bandwidth()
    knobs = ("PARTIAL_DTYPE", "MERGE_IN_KERNEL_BYTES")
    defaults = [getattr(triton_sparse_mla, k) for k in knobs]

    def set_knobs(values) -> None:
        for k, v in zip(knobs, values, strict=True):
            setattr(triton_sparse_mla, k, v)

    result = {"device": torch.cuda.get_device_name(), "command": " ".join(sys.argv), "copy": copy, "rows": []}
    for shape in args.shapes.split(","):
        batch, heads = (int(v) for v in shape.split("x"))
        q = torch.randn(batch, heads, width, device=DEV).bfloat16()
        slots = scattered_slots(batch, topk, cache_tokens)
        lens = None
        if args.valid_len:
            lens = torch.full((batch,), args.valid_len, dtype=torch.int32, device=DEV)
            slots = slots.masked_fill(torch.arange(topk, device=DEV)[None, :] >= args.valid_len, -1)
        cfg = triton_sparse_mla.default_config(batch, heads, topk)
        times = {arm[0]: [] for arm in arms}
        for _ in range(args.rounds):
            for name, *values in arms:
                set_knobs(values)
                times[name].append(time_ms(
                    lambda q=q, s=slots, n=lens: triton_sparse_mla.sparse_mla(q, kv, s, rank, width**-0.5, valid_lens=n),
                    args.iters, flush="read"))
        set_knobs(defaults)
        nbytes = sparse_mla_bytes(batch, heads, min(topk, args.valid_len or topk), rank, rope)
        row = {"batch": batch, "heads": heads, "topk": topk, "valid_len": args.valid_len or topk, "config": cfg,
               "arms": {}}
        for name, dtype, merge_bytes in arms:
            ts = times[name]
            med = statistics.median(ts)
            set_knobs((dtype, merge_bytes))
            merge, part_dtype = triton_sparse_mla.merge_plan(cfg, rank)
            row["arms"][name] = {
                "partial_dtype_setting": dtype, "merge_in_kernel_bytes": merge_bytes, "merges_in_kernel": merge,
                "partials": str(part_dtype).removeprefix("torch."),
                "ms_rounds": ts, "ms_median": med, "ms_min": min(ts), "ms_max": max(ts),
                "fraction_of_copy": nbytes / med * 1e3 / copy["bytes_per_s"]}
        set_knobs(defaults)
        result["rows"].append(row)
        print(f"{batch}x{heads}, {cfg['splits']} splits:", flush=True)
        for name, arm in row["arms"].items():
            print(f"  {name:12s} {arm['ms_median'] * 1e3:6.1f} us [{arm['ms_min'] * 1e3:.1f}, {arm['ms_max'] * 1e3:.1f}]"
                  f" {arm['fraction_of_copy']:.1%} of copy (in-kernel: {arm['merges_in_kernel']}, {arm['partials']})", flush=True)
    Path(args.out).write_text(json.dumps({"provenance": provenance(), **result}, indent=1))


if __name__ == "__main__":
    main()
