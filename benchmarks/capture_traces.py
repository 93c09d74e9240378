"""Capture decode-step traces of the embedded engine under both indexer bounds (issue 6).

For each bound: a real server process, a bounded streaming load at `--concurrency`, and
`rooftop.profile.capture` around `--steps` decode steps once every stream decodes. The traces
are written as `<prefix>_<bound>_ctx<context>.json.gz`.

    python benchmarks/capture_traces.py --device cuda --preset tiny --context-length 262144 \
        --out tests/profile/data --prefix h200
"""

import argparse
import asyncio
import shutil
import tempfile
from pathlib import Path

from rooftop.bench.subproc import ChildServer, python_module
from rooftop.profile.capture import capture


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--context-length", type=int, default=262144)
    ap.add_argument("--bounds", default="capacity,actual")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prefix", default="trace")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for bound in args.bounds.split(","):
        with tempfile.TemporaryDirectory() as prof_dir:
            argv = python_module(
                "rooftop.engine", "--preset", args.preset, "--device", args.device, "--port", "0",
                "--indexer-bound", bound, "--context-length", str(args.context_length),
                "--max-running-requests", str(args.concurrency), "--profile-dir", prof_dir,
                "--kv-cache-tokens", str(args.context_length + args.concurrency * 1024),
            )
            with ChildServer(argv, "ready on", timeout_s=600, env={"OMP_NUM_THREADS": "1"}) as srv:
                path = asyncio.run(capture(srv.url, prof_dir + "/kept", engine="embedded", steps=args.steps,
                                           concurrency=args.concurrency))
            dst = out / f"{args.prefix}_{bound}_ctx{args.context_length}.json.gz"
            shutil.copyfile(path, dst)
            print(f"{bound}: {dst} ({dst.stat().st_size / 1e6:.1f} MB)", flush=True)


if __name__ == "__main__":
    main()
