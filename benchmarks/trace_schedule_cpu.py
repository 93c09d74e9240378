"""How closely a trace replay keeps to the trace's clock: actual minus scheduled send time, per request.

    .venv/bin/python benchmarks/trace_schedule_cpu.py --requests 2000 --rate 100 --out docs/perf/trace-schedule-cpu.json

Writes a Mooncake-format trace (JSON Lines: timestamp in ms, input_length, output_length, hash_ids) of
--requests requests at about --rate requests/s (Poisson, seeded; prompts of 1 to 3 blocks of 512 tokens, the
first block drawn from a pool of shared prefixes), starts rooftop's synthetic server (a separate process, at
nice 19 as `rooftop calibrate` runs it, so that the client under test comes first),
replays the trace with `rooftop bench --dataset mooncake` (run_bench, the same path), and reports
sent_ns - scheduled_ns of the measured requests: p50, p99 and max in ms, with the load average around the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
from pathlib import Path

import numpy as np

from rooftop.bench.subproc import ChildServer, python_module
from rooftop.bench.sweep import BenchConfig, run_bench
from rooftop.provenance import provenance


def write_trace(path: Path, n: int, rate: float, seed: int) -> None:
    """A Mooncake-format trace: Poisson arrivals at `rate` (ms timestamps), shared first blocks."""
    rng = random.Random(seed)
    t_s, next_id = 0.0, 1000
    prefixes = list(range(64))  # first blocks shared between requests
    with path.open("w") as f:
        for _ in range(n):
            blocks = rng.randint(1, 3)
            input_length = (blocks - 1) * 512 + rng.randint(64, 512)
            ids = [rng.choice(prefixes)] + list(range(next_id, next_id + blocks - 1))
            next_id += blocks - 1
            f.write(json.dumps({"timestamp": int(t_s * 1000), "input_length": input_length,
                                "output_length": rng.randint(4, 16), "hash_ids": ids}) + "\n")
            t_s += rng.expovariate(rate)


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--ttft-ms", type=float, default=5.0)
    ap.add_argument("--itl-ms", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-nice", type=int, default=19,
                    help="the server's lower CPU priority, as rooftop calibrate's: the client under test goes first")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "mooncake.jsonl"
        write_trace(trace, args.requests, args.rate, args.seed)
        server = ChildServer(python_module("rooftop.bench.fakeserver", "--port", "0", "--ttft-ms", str(args.ttft_ms),
                                           "--itl-ms", str(args.itl_ms), "--nice", str(args.server_nice)),
                             "fakeserver ready")
        try:
            cfg = BenchConfig(base_url=server.url, dataset="mooncake", dataset_path=str(trace), concurrency=[],
                              num_requests=None, warmup=4, input_len=64, output_len=4, telemetry=False,
                              seed=args.seed)
            load_before = loadavg()
            outcome = asyncio.run(run_bench(cfg))
            load_after = loadavg()
        finally:
            server.stop()
    recs = [r for r in outcome.records if not r.warmup]
    lag_ms = np.array([(r.sent_ns - r.scheduled_ns) / 1e6 for r in recs if r.sent_ns is not None])
    level = outcome.summary["levels"][0]
    result = {
        "provenance": provenance(),
        "trace": {"format": "mooncake", "requests": args.requests, "rate": args.rate, "seed": args.seed,
                  "span_s": outcome.summary["trace"]["span_s"], "mean_rate": outcome.summary["trace"]["mean_rate"]},
        "server": {"ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms, "nice": args.server_nice},
        "sent": int(lag_ms.size), "completed": level["completed"], "failed": level["failed"],
        "send_lag_ms": {"p50": round(float(np.percentile(lag_ms, 50)), 4),
                        "p99": round(float(np.percentile(lag_ms, 99)), 4), "max": round(float(lag_ms.max()), 4),
                        "min": round(float(lag_ms.min()), 4)},
        "loadavg_before": load_before, "loadavg_after": load_after,
    }
    print(f"{result['sent']} requests at ~{args.rate:g}/s ({result['completed']} ok, {result['failed']} failed); "
          f"actual - scheduled send ms: p50 {result['send_lag_ms']['p50']:.3f}  p99 {result['send_lag_ms']['p99']:.3f}  "
          f"max {result['send_lag_ms']['max']:.3f}  (load average {load_before:.2f} -> {load_after:.2f})")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
