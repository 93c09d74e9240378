"""Graphed decode steps of one model under several knob settings, timed alternately in one process.

Run-to-run spread of a graphed step on the H200 reached 9% between two processes of one tree
(docs/perf/engine-serve-h200.md), more than most single changes. Here each variant is a set of
module constants (`MODULE.NAME=JSON`, as engine_decode_gpu.py's --set) applied while its graphs are
captured, over the same weights and cache; then the variants' graphs replay in turns, round after
round, so drift hits them alike. Reports each variant's median step and the paired ratio to the
first variant per round.

    python3 benchmarks/decode_ab_gpu.py --context 288 --concurrency 1,64 \
        --variant base= --variant no-side-stream=rooftop.engine.model.side_stream.ENABLED=false \
        [--rounds 20] [--iters 20] [--out decode-ab.json]

A variant is NAME=SET[;SET...]; an empty SET list is the code as it stands.
"""

import argparse
import math
import statistics
import sys
import time

import torch
from kernels_gpu import parse_knob, replay_times_ms, write_result  # this folder's (run as a script)

from rooftop.engine.cuda_graphs import DecodeGraphs
from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.batch import build_batch
from rooftop.engine.model.config import ModelConfig
from rooftop.engine.model.weights import random_model

DEV = "cuda"
BLOCK = 64


def parse_variant(text: str) -> tuple[str, list[tuple[object, str, object]]]:
    """'name=mod.NAME=json;mod.NAME=json' -> (name, [(module, attribute, value)])."""
    name, _, sets = text.partition("=")
    if not name:
        raise SystemExit(f"--variant {text!r}: give it a name, e.g. base=")
    return name, [parse_knob(item, f"--variant {name}:") for item in filter(None, sets.split(";"))]


def capture(model, cache, conc, cap_pages, knobs) -> DecodeGraphs:
    """Decode graphs captured with `knobs` set (and put back after)."""
    saved = [(mod, attr, getattr(mod, attr)) for mod, attr, _ in knobs]
    try:
        for mod, attr, value in knobs:
            setattr(mod, attr, value)
        return DecodeGraphs(model, cache, conc, max_pages=cap_pages, dummy_block=cache.num_blocks - 1)
    finally:
        for mod, attr, value in saved:
            setattr(mod, attr, value)


def logit_diffs(graphs: dict, batch, base: str, replays: int) -> dict[str, float]:
    """Each variant's largest |logit - the first variant's| over `replays` replays of `batch` (a
    variant that only reorders work, or overlaps kernels, must give 0: a race shows here)."""
    want = graphs[base].run(batch).float().clone()
    finite = torch.isfinite(want)  # masked ids are -inf in every variant
    out = {}
    for name, g in graphs.items():
        out[name] = 0.0
        for _ in range(replays):
            got = g.run(batch).float()
            same_mask = bool(torch.equal(torch.isfinite(got), finite))
            out[name] = max(out[name], float((got - want)[finite].abs().max()) if same_mask else float("inf"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--context", type=int, default=288)
    ap.add_argument("--capacity", type=int, default=131072)
    ap.add_argument("--concurrency", default="1,64")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=SETS")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--iters", type=int, default=20, help="replays a variant times per round")
    ap.add_argument("--check-replays", type=int, default=20, help="replays each variant's logits are checked over")
    ap.add_argument("--out", default="decode-ab.json")
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variant or ["base="]]
    conc = [int(c) for c in args.concurrency.split(",")]
    t0 = time.time()
    config = ModelConfig.preset(args.preset)
    model = random_model(config, seed=0, device=DEV)
    pages = math.ceil(args.context / BLOCK)
    cache = KVCache(config, max(conc) * pages + 1, BLOCK, torch.bfloat16, DEV)
    for t in cache.latent + cache.index_k:
        t.normal_()
    cap_pages = math.ceil(args.capacity / BLOCK)
    graphs = {name: capture(model, cache, conc, cap_pages, knobs) for name, knobs in variants}
    print(f"captured {len(graphs)} variants at {conc} in {time.time() - t0:.0f} s", flush=True)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "command": " ".join(sys.argv),
              "context": args.context, "rounds": args.rounds, "iters": args.iters, "rows": []}
    for c in conc:
        tables = [[b * pages + j for j in range(pages)] for b in range(c)]
        new = [[(7 * b + 65) % 256] for b in range(c)]
        batch = build_batch(new, [args.context - 1] * c, tables, BLOCK, args.capacity, "actual", DEV)
        per_round = {name: [] for name in graphs}
        for _ in range(args.rounds):
            for name, g in graphs.items():
                per_round[name].append(statistics.median(replay_times_ms(lambda g=g, b=batch: g.run(b), args.iters, 2)))
        base = variants[0][0]
        diffs = logit_diffs(graphs, batch, base, args.check_replays)
        for name, times in per_round.items():
            ratios = sorted(t / b for t, b in zip(times, per_round[base], strict=True))
            row = {"concurrency": c, "variant": name, "median_ms": statistics.median(times),
                   "min_ms": min(times), "max_ms": max(times), "ratio_to_first_median": statistics.median(ratios),
                   "ratio_to_first_min": ratios[0], "ratio_to_first_max": ratios[-1],
                   "max_abs_logit_diff_vs_first": diffs[name], "round_ms": times}
            result["rows"].append(row)
            print(f"C={c} {name:24s} {row['median_ms']:.3f} ms [{row['min_ms']:.3f}, {row['max_ms']:.3f}]  "
                  f"x{row['ratio_to_first_median']:.3f} [{ratios[0]:.3f}, {ratios[-1]:.3f}] of {base}, "
                  f"logits within {diffs[name]:.3g}", flush=True)
    write_result(result, args.out, t0)


if __name__ == "__main__":
    main()
