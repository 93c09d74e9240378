"""Decode TPOT of the embedded engine's `tiny` preset on CPU under both indexer bounds and two
context lengths, measured with rooftop's own load generator (issue 3, must-show 3).

Each configuration gets its own server process (one torch thread); the same random 128-token
prompts and 32 forced output tokens go to each. Prints a table and writes JSON.

    .venv/bin/python benchmarks/indexer_bound_cpu.py [--concurrency 1,4] [--repeats 3] [--out docs/perf/indexer-bound-cpu.json]
"""

import argparse
import asyncio
import json
import os
import platform

from rooftop.bench.subproc import ChildServer, python_module
from rooftop.bench.sweep import BenchConfig, run_bench
from rooftop.provenance import provenance

CONFIGS = [("actual", 4096), ("actual", 65536), ("capacity", 4096), ("capacity", 65536)]


def run_one(bound: str, context: int, args) -> dict:
    argv = python_module("rooftop.engine", "--preset", "tiny", "--port", "0", "--indexer-bound", bound,
                         "--context-length", str(context), "--max-running-requests", "16", "--threads", "1",
                         "--kv-cache-tokens", str(max(context, 16 * 256)))
    with ChildServer(argv, "ready on", timeout_s=300, env={"OMP_NUM_THREADS": "1"}) as srv:
        cfg = BenchConfig(base_url=srv.url, input_len=args.input_len, output_len=args.output_len,
                          concurrency=args.concurrency, num_requests=args.num_requests, repeats=args.repeats,
                          warmup=2, seed=1)
        out = asyncio.run(run_bench(cfg))
    return {"indexer_bound": bound, "context_length": context, "argv": argv[1:], "summary": out.summary}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--num-requests", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    results = [run_one(b, c, args) for b, c in CONFIGS]
    print(f"{'bound':<9}{'context':>8}{'C':>4}{'TPOT p50 ms':>13}{'TPOT mean ms (95% CI)':>28}{'out tok/s':>11}")
    for r in results:
        for lv in r["summary"]["levels"]:
            t = lv["tpot_ms"]
            print(f"{r['indexer_bound']:<9}{r['context_length']:>8}{lv['concurrency']:>4}{t['median']:>13.2f}"
                  f"{t['mean']:>12.2f} ({t.get('ci_low', float('nan')):.2f}–{t.get('ci_high', float('nan')):.2f})"
                  f"{lv['output_tok_s']['mean']:>11.1f}")
    doc = {"provenance": provenance(), "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
           "args": {k: v for k, v in vars(args).items()}, "results": results}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
