"""The embedded engine served for real and measured with rooftop's load generator, both indexer
bounds at one large context length; one profile of each (issue 3 must-show 4, issue 6 must-show 2).
The bench reads the server's /metrics step histogram around each level, so each level also carries
the engine's own decode-step time (`engine_decode_step_ms`), apart from the prefills in TPOT.

For each bound: start `python -m rooftop.engine` (a real server process), sweep concurrency with
`rooftop.bench`, then capture a torch-profiler trace through POST /start_profile and /stop_profile
while a short load runs, and keep the server's /metrics. Writes everything under --out.

    python benchmarks/engine_serve_gpu.py --preset small --device cuda --context-length 65536 --out $OUT
    python benchmarks/engine_serve_gpu.py --preset tiny --device cpu --context-length 8192 \
        --concurrency 1,4 --num-requests 8 --out /tmp/x      # a quick CPU check of the script
"""

import argparse
import asyncio
import json
import os
import platform
import shutil
import time
from pathlib import Path

import aiohttp

import rooftop
from rooftop.bench.subproc import ChildServer, python_module
from rooftop.bench.sweep import BenchConfig, run_bench
from rooftop.provenance import provenance


async def _profile(url: str, args, out: Path, tag: str) -> dict:
    """Profile while a short load runs: a few decode steps at the profile concurrency."""
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/start_profile") as r:
            started = r.status
        cfg = BenchConfig(base_url=url, input_len=args.input_len, output_len=args.profile_output_len,
                          concurrency=[args.profile_concurrency], num_requests=args.profile_concurrency,
                          warmup=0, seed=7)
        await run_bench(cfg)
        async with s.post(f"{url}/stop_profile") as r:
            body = await r.json()
        async with s.get(f"{url}/metrics") as r:
            metrics = await r.text()
    trace = Path(body.get("trace", ""))
    kept = None
    if trace.is_file():
        kept = out / f"trace-{tag}.json.gz"
        shutil.copy(trace, kept)
    return {"start_status": started, "stop": body, "kept": str(kept) if kept else None, "metrics": metrics}


def run_bound(bound: str, args, out: Path) -> dict:
    tag = f"{bound}-{args.context_length}"
    prof_dir = out / f"profiles-{tag}"
    argv = python_module(
        "rooftop.engine", "--preset", args.preset, "--port", "0", "--device", args.device,
        "--indexer-bound", bound, "--context-length", str(args.context_length),
        "--max-running-requests", str(max(args.concurrency)), "--profile-dir", str(prof_dir),
        *(["--kv-cache-tokens", str(args.kv_cache_tokens)] if args.kv_cache_tokens else []),
        *(["--no-cuda-graphs"] if args.no_cuda_graphs else []),
        *(["--engine-process", args.engine_process] if args.engine_process else []),
    )
    t0 = time.monotonic()
    with ChildServer(argv, "ready on", timeout_s=args.start_timeout, env={"OMP_NUM_THREADS": "1"}) as srv:
        ready_s = time.monotonic() - t0
        print(f"[{tag}] ready in {ready_s:.0f} s at {srv.url}", flush=True)
        cfg = BenchConfig(base_url=srv.url, input_len=args.input_len, output_len=args.output_len,
                          concurrency=args.concurrency, num_requests=args.num_requests, repeats=args.repeats,
                          warmup=4, seed=1, metrics_url=f"{srv.url}/metrics")
        outcome = asyncio.run(run_bench(cfg))
        for lv in outcome.summary["levels"]:
            step = lv.get("engine_decode_step_ms")
            decode = (lv.get("engine_steps") or {}).get("decode", {})
            device = (f" (its forward on the device {decode['device_ms_per_step']:.3f} ms: served/forward "
                      f"{decode['wall_over_device']:.3f}x)" if "device_ms_per_step" in decode else "")
            print(f"[{tag}] {lv['label']}: {lv['output_tok_s']['mean']:.1f} tok/s, "
                  f"TPOT p50 {lv['tpot_ms']['median']:.2f} ms, TTFT p50 {lv['ttft_ms']['median']:.1f} ms, "
                  f"engine decode step {'-' if step is None else f'{step:.3f} ms'}{device}", flush=True)
        prof = asyncio.run(_profile(srv.url, args, out, tag))
        print(f"[{tag}] profile: {prof['stop']}", flush=True)
        log_tail = srv.lines[-30:]
    shutil.rmtree(prof_dir, ignore_errors=True)
    return {"bound": bound, "context_length": args.context_length, "argv": argv[1:], "ready_s": ready_s,
            "summary": outcome.summary, "profile": prof, "server_log_tail": log_tail}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--context-length", type=int, default=65536)
    ap.add_argument("--kv-cache-tokens", type=int, default=None)
    ap.add_argument("--bounds", default="capacity,actual")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--profile-concurrency", type=int, default=16)
    ap.add_argument("--profile-output-len", type=int, default=8)
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument("--engine-process", choices=["auto", "on", "off"], default=None,
                    help="the server's --engine-process (default: the server's own default, auto)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # The server starts as `python -m rooftop.engine`, which imports rooftop from the current directory
    # first: run it from the checkout this script imported, so that PYTHONPATH=<checkout> serves that
    # checkout too (from elsewhere the server would run whatever rooftop the directory holds).
    checkout = Path(rooftop.__file__).resolve().parents[1]
    os.chdir(checkout)
    print(f"serving rooftop from {checkout}", flush=True)
    results = []
    for bound in args.bounds.split(","):
        results.append(run_bound(bound, args, out))
        (out / "engine-serve.json").write_text(json.dumps({
            "provenance": provenance(),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "args": {k: v for k, v in vars(args).items()}, "results": results}, indent=2, default=str))


if __name__ == "__main__":
    main()
