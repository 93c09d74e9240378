"""The decode indexer's top-k selection in its scoring kernel (the last program of each sequence)
against a second kernel, A/B on one GPU.

At each (batch, actual length, capacity) the engine's call (`ordered=False, slots=True`, the small
preset's 32 heads x 128) runs with `triton_indexer.SELECT_IN_SCORE` on and off, alternating for
`--rounds` rounds of graph replays (kernels_gpu.time_ms, L2 flushed by a read before each).

    python3 benchmarks/indexer_select_ab_gpu.py [--cases 1x288x131072,64x288x131072] [--rounds 6] [--out F.json]
"""

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels_gpu import _indexer_inputs, time_ms  # noqa: E402

from rooftop.engine.kernels import triton_indexer  # noqa: E402

DEFAULT_CASES = "1x288x131072,16x288x131072,64x288x131072,1x4096x131072,32x4096x131072,32x32768x131072,64x512x8192"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=DEFAULT_CASES, help="BATCHxLENGTHxCAPACITY,...")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--out", default="indexer-select-ab.json")
    args = ap.parse_args()
    topk, default = 2048, triton_indexer.SELECT_IN_SCORE
    result = {"device": torch.cuda.get_device_name(), "command": " ".join(sys.argv), "rows": []}
    for case in args.cases.split(","):
        batch, length, capacity = (int(v) for v in case.split("x"))
        pages = math.ceil(capacity / 64)
        inputs = (*_indexer_inputs(batch, args.heads, 128, length, pages), pages, topk)
        times = {"in_score": [], "own_kernel": []}
        picks = {}
        for _ in range(args.rounds):
            for arm, on in (("in_score", True), ("own_kernel", False)):
                triton_indexer.SELECT_IN_SCORE = on
                times[arm].append(time_ms(
                    lambda a=inputs: triton_indexer.indexer_topk_decode(*a, ordered=False, slots=True), args.iters))
                picks[arm] = triton_indexer.indexer_topk_decode(*inputs, ordered=False, slots=True)
        triton_indexer.SELECT_IN_SCORE = default
        row = {"batch": batch, "length": length, "capacity": capacity, "heads": args.heads, "topk": topk,
               "same_picks": bool(torch.equal(picks["in_score"], picks["own_kernel"]))}
        for arm, ts in times.items():
            row[arm] = {"us_rounds": [t * 1e3 for t in ts], "us_median": statistics.median(ts) * 1e3,
                        "us_min": min(ts) * 1e3, "us_max": max(ts) * 1e3}
        result["rows"].append(row)
        print(f"{case}: in score {row['in_score']['us_median']:.1f} us [{row['in_score']['us_min']:.1f}, "
              f"{row['in_score']['us_max']:.1f}], own kernel {row['own_kernel']['us_median']:.1f} us "
              f"[{row['own_kernel']['us_min']:.1f}, {row['own_kernel']['us_max']:.1f}], same picks {row['same_picks']}",
              flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
