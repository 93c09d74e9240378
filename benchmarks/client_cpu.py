"""CPU time per streamed chunk: the load client's (one event loop, in this process) and the synthetic server's.

    .venv/bin/python benchmarks/client_cpu.py --concurrency 256 --requests 1536 --runs 3 --out cpu.json

Starts rooftop's synthetic server (a separate process), runs one warm-up level, then each measured
level at --concurrency (256 or fewer keeps the client in one process), and divides the CPU time each
process spent during the level (user + system: this process's from time.process_time, the server's
from /proc) by the chunks streamed. Runs against whatever `rooftop` is importable, so the same script
measures an older checkout with PYTHONPATH=that/checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from rooftop.bench.datasets import Prompt
from rooftop.bench.level import make_session, run_level
from rooftop.bench.loadgen import LevelPlan, Target
from rooftop.bench.subproc import ChildServer, python_module
from rooftop.provenance import provenance


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(url: str, server_pid: int, concurrency: int, requests: int, output_len: int, runs: int) -> list[dict]:
    prompt = [Prompt("calibrate " * 4, 40, output_len)]
    target = Target(url, "fake", force_length=True, timeout_s=120)
    out = []
    async with make_session(concurrency) as session:
        await run_level(session, target, LevelPlan(concurrency=concurrency, num_requests=concurrency), prompt, warmup=True)
        for _ in range(runs):
            load = float(Path("/proc/loadavg").read_text().split()[0])
            client0, server0 = time.process_time(), proc_cpu_s(server_pid)
            run = await run_level(session, target, LevelPlan(concurrency=concurrency, num_requests=requests), prompt)
            client_s, server_s = time.process_time() - client0, proc_cpu_s(server_pid) - server0
            chunks = sum(len(r.chunk_ns) for r in run.records if r.status == "ok")
            wall_s = (run.end_ns - run.start_ns) / 1e9
            out.append({"concurrency": concurrency, "requests": requests, "chunks": chunks,
                        "chunks_per_s": round(chunks / wall_s), "client_us_per_chunk": round(client_s / chunks * 1e6, 2),
                        "server_us_per_chunk": round(server_s / chunks * 1e6, 2), "loadavg_before": load})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--requests", type=int, default=1536)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    argv = python_module("rooftop.bench.fakeserver", "--port", "0", "--ttft-ms", str(args.ttft_ms),
                         "--itl-ms", str(args.itl_ms))
    with ChildServer(argv, "fakeserver ready") as server:
        rows = asyncio.run(measure(server.url, server.proc.pid, args.concurrency, args.requests, args.output_len,
                                   args.runs))
    print(f"{'C':>5} {'chunks/s':>9} {'client us/chunk':>16} {'server us/chunk':>16} {'load':>5}")
    for r in rows:
        print(f"{r['concurrency']:>5} {r['chunks_per_s']:>9} {r['client_us_per_chunk']:>16} "
              f"{r['server_us_per_chunk']:>16} {r['loadavg_before']:>5}")
    if args.out:
        args.out.write_text(json.dumps({"provenance": provenance(), "schedule": {"ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms,
                                                     "output_len": args.output_len}, "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
