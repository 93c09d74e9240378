"""Time and peak memory of `rooftop profile --json` on a large Kineto trace (and optionally HTA's load).

Each measured command runs in its own child process, one after the other, so that its time and peak
RSS are its own (peak RSS from wait4). Make the trace by growing a real one (--grow-from, see
benchmarks/grow_trace.py) or by profiling many steps of the toy model (--make-steps). --before DIR
runs the same command with the rooftop package from DIR (e.g. `git archive HEAD~3 rooftop | tar -x
-C /tmp/before`), for a before/after on the same file. HTA must be installed in a separate
interpreter (--hta-python), e.g.
    python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install HolisticTraceAnalysis

    .venv/bin/python benchmarks/profile_parse.py --trace /tmp/big3.json --skip-hta \
        --grow-from tests/profile/data/h200_capacity_ctx262144.json.gz --size-gb 3 --out run.json
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from rooftop.provenance import provenance

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

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


CLI_CHILD = """
import sys
from rooftop.cli import main
sys.argv = ["rooftop", "profile", *sys.argv[1:]]
main()
"""


def run_child(argv: list[str], cwd: Path = ROOT) -> tuple[dict, float, float]:
    """Run a child; (its JSON output, wall seconds, peak RSS in GiB)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall_s = time.perf_counter() - t0
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{argv[0]} failed ({proc.returncode}):\n{err[-3000:]}")
    text = out.strip()
    data = json.loads(text) if text.startswith("{\n") else json.loads(text.splitlines()[-1])
    return data, wall_s, usage.ru_maxrss / 2**20  # KiB -> GiB


def run_cli(trace: Path, context_length: int, code_dir: Path | None = None) -> tuple[dict, float, float]:
    """`rooftop profile TRACE --json --context-length N` in a child (rooftop from `code_dir` if given:
    `python -c` looks in its working directory first)."""
    argv = [sys.executable, "-c", CLI_CHILD, str(trace.resolve()), "--json", "--context-length", str(context_length)]
    return run_child(argv, code_dir.resolve() if code_dir is not None else ROOT)


def make_trace(path: Path, steps: int, layers: int) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "profile"))
    from toy_model import make_trace as make

    make(path, capacity=256, context=64, steps=steps, layers=layers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--make-steps", type=int, default=0, help="profile this many toy-model steps into --trace first")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--grow-from", type=Path, default=None, help="grow this real trace into --trace first")
    ap.add_argument("--size-gb", type=float, default=1.0, help="with --grow-from: the size to grow to")
    ap.add_argument("--context-length", type=int, default=262144)
    ap.add_argument("--before", type=Path, default=None, help="also run the CLI with the rooftop package from here")
    ap.add_argument("--hta-python", default="/tmp/hta-venv/bin/python")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.grow_from and not args.trace.exists():
        from grow_trace import grow

        grow(args.grow_from, args.trace, int(args.size_gb * 1e9))
    if args.make_steps and not args.trace.exists():
        make_trace(args.trace, args.make_steps, args.layers)
    size_mb = args.trace.stat().st_size / 1e6

    machine = f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, {platform.python_version()}"
    result = {"provenance": provenance(), "trace": str(args.trace), "size_mb": size_mb, "machine": machine,
              "command": f"rooftop profile {args.trace} --json --context-length {args.context_length}"}
    rows = []
    if args.before is not None:
        before, before_wall, before_rss = run_cli(args.trace, args.context_length, args.before)
        rows.append(("before: rooftop profile --json", before_wall, before_rss))
        result.update({"before_code": str(args.before), "before_wall_s": before_wall,
                       "before_peak_rss_gib": before_rss, "before_steps": before["steps"]})
    ours, ours_wall, ours_rss = run_cli(args.trace, args.context_length)
    rows.append(("rooftop profile --json", ours_wall, ours_rss))
    result.update({"rooftop_wall_s": ours_wall, "rooftop_peak_rss_gib": ours_rss, "steps": ours["steps"],
                   "top_component": ours["components"][0]["name"],
                   "capacity_findings": len(ours["capacity_findings"])})
    if args.before is not None:
        result["same_summary"] = before == ours
    if not args.skip_hta:
        hta, hta_wall, hta_rss = run_child([args.hta_python, "-c", HTA_CHILD, str(args.trace)])
        rows.append(("HTA TraceAnalysis (load)", hta_wall, hta_rss))
        result.update({"hta": hta, "hta_wall_s": hta_wall, "hta_peak_rss_gib": hta_rss,
                       "speedup_wall": hta_wall / ours_wall, "rss_ratio": ours_rss / hta_rss})

    print(f"trace {args.trace} ({size_mb:.0f} MB, {ours['steps']} steps)")
    print(f"{'':32s} {'wall s':>8s} {'peak RSS GiB':>13s}")
    for name, wall, rss in rows:
        print(f"{name:32s} {wall:8.1f} {rss:13.2f}")
    if "same_summary" in result:
        print("before and after give the same summary" if result["same_summary"] else "the summaries DIFFER")
    if args.out:
        runs = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.write_text(json.dumps(runs + [result], indent=2) + "\n")


if __name__ == "__main__":
    main()
