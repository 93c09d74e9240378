"""Parse + attribute a large Kineto trace with rooftop, and load the same trace with Holistic Trace Analysis.

Each side runs in its own child process, one after the other, so that its time and peak RSS are its
own (peak RSS from wait4). HTA must be installed in a separate interpreter (--hta-python), e.g.
    python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install HolisticTraceAnalysis
Make a trace by profiling many steps of the toy model (tests/profile/toy_model.py) with --make-steps.

    .venv/bin/python benchmarks/profile_parse.py --trace /tmp/big.json --make-steps 1000 \
        --hta-python /tmp/hta-venv/bin/python --out docs/perf/profile-parse.json
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ROOFTOP_CHILD = """
import json, sys, time
t0 = time.perf_counter()
from rooftop.profile import analyze, load_trace
trace = load_trace(sys.argv[1])
t1 = time.perf_counter()
summary = analyze(trace, context_length=int(sys.argv[2]))
t2 = time.perf_counter()
print(json.dumps({"parse_s": t1 - t0, "attribute_s": t2 - t1, "events": trace.events_read,
                  "top_component": summary.components[0].name,
                  "capacity_findings": len(summary.capacity_findings)}))
"""

HTA_CHILD = """
import json, os, sys, time, logging
logging.disable(logging.WARNING)
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
path = sys.argv[1]
analysis = TraceAnalysis(trace_files={0: path}, trace_dir=os.path.dirname(path))
t1 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "rows": int(len(analysis.t.get_trace(0)))}))
"""


def run_child(argv: list[str]) -> tuple[dict, float, float]:
    """Run a child; (its JSON line, wall seconds, peak RSS in GiB)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall_s = time.perf_counter() - t0
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{argv[0]} failed ({proc.returncode}):\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1]), wall_s, usage.ru_maxrss / 2**20  # KiB -> GiB


def make_trace(path: Path, steps: int, layers: int) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "profile"))
    from toy_model import make_trace as make

    make(path, capacity=256, context=64, steps=steps, layers=layers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--make-steps", type=int, default=0, help="profile this many toy-model steps into --trace first")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hta-python", default="/tmp/hta-venv/bin/python")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.make_steps and not args.trace.exists():
        make_trace(args.trace, args.make_steps, args.layers)
    size_mb = args.trace.stat().st_size / 1e6

    ours, ours_wall, ours_rss = run_child([sys.executable, "-c", ROOFTOP_CHILD, str(args.trace), "256"])
    rows = [("rooftop load_trace + analyze", ours_wall, ours["parse_s"] + ours["attribute_s"], ours_rss)]
    result = {"trace": str(args.trace), "size_mb": size_mb, "events": ours["events"], "rooftop": ours,
              "rooftop_wall_s": ours_wall, "rooftop_peak_rss_gib": ours_rss,
              "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, {platform.python_version()}"}
    if not args.skip_hta:
        hta, hta_wall, hta_rss = run_child([args.hta_python, "-c", HTA_CHILD, str(args.trace)])
        rows.append(("HTA TraceAnalysis (load)", hta_wall, hta["load_s"], hta_rss))
        result.update({"hta": hta, "hta_wall_s": hta_wall, "hta_peak_rss_gib": hta_rss,
                       "speedup_wall": hta_wall / ours_wall, "rss_ratio": ours_rss / hta_rss})

    print(f"trace {args.trace} ({size_mb:.0f} MB, {ours['events']:,} events)")
    print(f"{'':32s} {'wall s':>8s} {'in-process s':>13s} {'peak RSS GiB':>13s}")
    for name, wall, inner, rss in rows:
        print(f"{name:32s} {wall:8.1f} {inner:13.1f} {rss:13.2f}")
    if "speedup_wall" in result:
        print(f"rooftop is {result['speedup_wall']:.1f}x faster (wall) with {result['rss_ratio']:.2f}x HTA's peak RSS")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
