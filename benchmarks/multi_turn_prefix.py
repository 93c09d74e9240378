"""Multi-turn conversations on the embedded engine with its prefix cache on and off: output tok/s and the TTFT
of later turns (whose history the cache may hold) against first turns, with intervals across repeats.

    python benchmarks/multi_turn_prefix.py --preset tiny --device cpu --out docs/perf/multi-turn-prefix-cpu.json
    python benchmarks/multi_turn_prefix.py --preset small --device cuda --sessions 64 --concurrency 64 \
        --turn-input-len 256 --turn-output-len 64 --out $OUT/multi-turn-prefix-h200.json

Each setting is its own server process (started here, on a free port of 127.0.0.1, stopped at the end); the
settings alternate on, off, on, off... once per round, so drift over the run falls on both. The hit rate is the
engine's own /metrics (vllm:prefix_cache_queries/hits over each level).
"""

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rooftop.bench.subproc import ChildServer, python_module  # noqa: E402
from rooftop.bench.sweep import BenchConfig, run_bench  # noqa: E402
from rooftop.provenance import provenance  # noqa: E402

READY = "rooftop-engine ready on"


def one_round(args, caching: bool, seed: int) -> dict:
    """One server with the cache on or off, `args.repeats` repeats of one closed-loop level of sessions."""
    argv = python_module("rooftop.engine", "--preset", args.preset, "--port", "0", "--device", args.device,
                         "--context-length", str(args.context_length), "--page-size", str(args.page_size),
                         *(() if caching else ("--no-enable-prefix-caching",)), *args.engine_arg)
    server = ChildServer(argv, READY, timeout_s=600, env={"OMP_NUM_THREADS": "1"} if args.device == "cpu" else None)
    try:
        cfg = BenchConfig(base_url=server.url, dataset="conversation", sessions=args.sessions, turns=args.turns,
                          turn_input_len=args.turn_input_len, turn_output_len=args.turn_output_len,
                          concurrency=[args.concurrency], num_requests=None, repeats=args.repeats, warmup=2,
                          seed=seed, metrics_url=server.url + "/metrics", telemetry=False)
        summary = asyncio.run(run_bench(cfg)).summary
    finally:
        server.stop()
    level = summary["levels"][0]
    return {"caching": caching, "seed": seed, "output_tok_s": level["output_tok_s"], "ttft_ms": level["ttft_ms"],
            "ttft_ms_by_turn": level.get("ttft_ms_by_turn"),
            "prefix_cache_hit_rate": (level.get("engine_server") or {}).get("prefix_cache_hit_rate"),
            "completed": level["completed"], "failed": level["failed"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4, help="sessions in flight")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--turn-input-len", type=int, default=128)
    ap.add_argument("--turn-output-len", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1, help="on/off pairs of server processes")
    ap.add_argument("--context-length", type=int, default=4096)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--engine-arg", action="append", default=[], help="one more flag for the engine (repeatable)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    results = [one_round(args, caching, seed=11 + r) for r in range(args.rounds) for caching in (True, False)]
    doc = {"provenance": provenance(), "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{'cache':6} {'tok/s [CI]':>26} {'TTFT turn 1 ms [CI]':>28} {'TTFT turns>=2 ms [CI]':>28} {'hit rate':>9}")
    for r in results:
        tok, by = r["output_tok_s"], r["ttft_ms_by_turn"] or {}
        first, later = by.get("first") or {}, by.get("later") or {}
        hit = r["prefix_cache_hit_rate"] or {}

        def ci(d):
            return f"{d.get('mean', float('nan')):.2f} [{d.get('ci_low') or float('nan'):.2f}, {d.get('ci_high') or float('nan'):.2f}]"

        print(f"{'on' if r['caching'] else 'off':6} {ci(tok):>26} {ci(first):>28} {ci(later):>28} "
              f"{100 * hit.get('mean', float('nan')):8.1f}%")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
