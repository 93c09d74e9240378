"""Run `rooftop calibrate --json` several times on a quiet machine and keep every run with its load.

    .venv/bin/python benchmarks/calibrate_runs.py --runs 3 --out docs/perf/calibration-2core-1024.json \
        -- --concurrency 256,1024

Before each run it waits (up to --wait-s) for the 1-minute load average to fall under --quiet, and it
records the load average before and after the run beside the command's own JSON, untouched. Prints
one line per level of every run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rooftop.provenance import git_state, provenance

ROOT = Path(__file__).resolve().parents[1]


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quiet", type=float, default=0.5, help="wait for the 1-minute load average to fall under this")
    ap.add_argument("--wait-s", type=float, default=600, help="give up waiting after this long (and say so)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("calibrate_args", nargs=argparse.REMAINDER, help="after --: rooftop calibrate's arguments")
    args = ap.parse_args()
    extra = [a for a in args.calibrate_args if a != "--"]
    argv = [str(Path(sys.executable).parent / "rooftop"), "calibrate", "--json", *extra]
    runs = []
    for i in range(args.runs):
        deadline = time.monotonic() + args.wait_s
        while loadavg()[0] >= args.quiet and time.monotonic() < deadline:
            time.sleep(5)
        before = loadavg()
        started = time.time()
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            sys.exit(f"{' '.join(argv)} failed:\n{done.stderr}")
        out = json.loads(done.stdout)
        sha, dirty, _ = git_state(ROOT)  # per run: the tree may change between runs
        runs.append({"run": i + 1, "command": " ".join(["rooftop", *argv[1:]]), "commit": sha, "dirty": dirty,
                     "started_unix": round(started), "loadavg_before": before, "loadavg_after": loadavg(),
                     "waited_for_quiet": before[0] < args.quiet, "output": out})
        for lv in out["levels"]:
            t, itl, late = lv["ttft_error_ms"], lv["itl_error_ms"], lv["server_late_ms"]
            print(f"run {i + 1} C={lv['concurrency']:<5} procs {lv['client_procs']}  TTFT err {t['median']}/{t['p99']} ms  "
                  f"ITL err {itl['median']}/{itl['p99']} ms  {lv['tokens_per_s']:.0f} tok/s  server late "
                  f"{late['median']}/{late['p99']} ms  holds {lv['holds']}  load {before[0]:.2f}->{loadavg()[0]:.2f}",
                  flush=True)
    args.out.write_text(json.dumps({"provenance": provenance(), "machine": {"cpus": os.cpu_count()}, "runs": runs},
                                       indent=1) + "\n")


if __name__ == "__main__":
    main()
