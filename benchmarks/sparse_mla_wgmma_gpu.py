"""Sparse MLA decode at DeepSeek's head count: the Gluon warpgroup-MMA kernel against the Triton one (H200).

For each shape (heads x batch, top-k 2048, slots scattered over a 4M-token cache as in kernels_gpu.py),
each arm is checked against the float64 reference, then timed in alternating rounds (graph replay,
256 MiB read flush before each call, median). TFLOP/s counts 2 x batch x heads x top-k x (576 + 512).

    python3 benchmarks/sparse_mla_wgmma_gpu.py [--shapes 128x64,128x128,64x64] [--rounds 4] \\
        [--arms gluon:64:2,gluon:32:3] [--valid-len N] [--out F.json]

An arm is `triton` (the entry point: Gluon where it takes the call), `triton-only` (the Triton kernels'
default tiles, given as a config so the Gluon kernel is not picked) or `gluon:BLOCK_N:STAGES[:WARPS]`.
"""

import argparse
import functools
import json
import statistics

import torch
import triton
from kernels_gpu import scattered_slots, time_ms  # this folder's (run as a script)

from rooftop.engine.kernels import gluon_sparse_mla, reference, triton_sparse_mla
from rooftop.provenance import provenance

RANK, ROPE, TOPK = 512, 64, 2048


def arm_call(arm: str, q, kv, slots, lens):
    scale = (RANK + ROPE) ** -0.5
    if arm == "triton":
        return functools.partial(triton_sparse_mla.sparse_mla, q, kv, slots, RANK, scale, valid_lens=lens)
    if arm == "triton-only":
        cfg = triton_sparse_mla.default_config(q.shape[0], q.shape[1], slots.shape[1])
        return functools.partial(triton_sparse_mla.sparse_mla, q, kv, slots, RANK, scale, config=cfg, valid_lens=lens)
    _, bn, stages, *more = arm.split(":")
    return functools.partial(gluon_sparse_mla.sparse_mla, q, kv, slots, RANK, scale, valid_lens=lens,
                             block_n=int(bn), stages=int(stages), num_warps=int(more[0]) if more else 8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="128x64,128x128,64x64")
    ap.add_argument("--arms", default="triton-only,gluon:64:2")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--valid-len", type=int, default=0)
    ap.add_argument("--out", default="sparse-mla-wgmma.json")
    args = ap.parse_args()
    width = RANK + ROPE
    cache_tokens = 1 << 22
    kv = torch.empty(cache_tokens // 64, 64, width, dtype=torch.bfloat16, device="cuda").normal_()
    arms = args.arms.split(",")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "topk": TOPK, "valid_len": args.valid_len, "rows": []}
    for shape in args.shapes.split(","):
        heads, batch = (int(v) for v in shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(heads * 1000 + batch)
        q = torch.randn(batch, heads, width, device="cuda", generator=g).bfloat16()
        slots = scattered_slots(batch, TOPK, cache_tokens, 0)
        lens = torch.full((batch,), args.valid_len, dtype=torch.int32, device="cuda") if args.valid_len else None
        # float64 reference on 4 tokens (the whole cache in float64 would not fit): gather their rows first.
        rows = slots[:4].clamp(min=0)
        sub = kv.view(-1, width)[rows.flatten()].view(4 * TOPK, 1, width).double()
        sub_slots = torch.arange(4 * TOPK, device="cuda").view(4, TOPK)
        if lens is not None:
            sub_slots = torch.where(torch.arange(TOPK, device="cuda")[None, :] < args.valid_len, sub_slots, -1)
        ref = reference.sparse_mla(q[:4].double(), sub, sub_slots, RANK, width**-0.5)
        flops = 2 * batch * heads * min(args.valid_len or TOPK, TOPK) * (width + RANK)
        times = {arm: [] for arm in arms}
        errors = {}
        for arm in arms:
            try:
                out = arm_call(arm, q, kv, slots, lens)()
                torch.cuda.synchronize()
                errors[arm] = float((out[:4].double() - ref).abs().max())
            except Exception as exc:  # noqa: BLE001 - a probe: report what failed and go on
                errors[arm] = f"{type(exc).__name__}: {exc}"[:400]
        for _ in range(args.rounds):
            for arm in arms:
                if isinstance(errors[arm], str):
                    continue
                times[arm].append(time_ms(arm_call(arm, q, kv, slots, lens), args.iters))
        for arm in arms:
            row = {"heads": heads, "batch": batch, "arm": arm, "max_abs_err_vs_float64": errors[arm]}
            if times[arm]:
                ms = statistics.median(times[arm])
                row.update(us=ms * 1e3, us_min=min(times[arm]) * 1e3, us_max=max(times[arm]) * 1e3,
                           tflops=flops / ms / 1e9, rounds_us=[t * 1e3 for t in times[arm]])
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "rounds_us"},
                  flush=True)
            result["rows"].append(row)
    with open(args.out, "w") as f:
        json.dump({"provenance": provenance(), **result}, f, indent=1)


if __name__ == "__main__":
    main()
