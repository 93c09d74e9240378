"""Client calibration: drive the synthetic server, whose every chunk carries its own send stamp,
and measure the load generator's own error (measured minus true) on TTFT and ITL.

True TTFT is what the server spent: first chunk sent minus request received. The client's error is
everything else it adds: getting the request onto the wire after deciding to send it, and how far a
chunk's stamp is from its arrival (the client stamps bytes with the kernel's receive time, stamped.py;
a read that comes late and takes two chunks at once gives the first the second's time). Both sides
read CLOCK_MONOTONIC (time.perf_counter_ns) on one host, so the stamps compare directly.

The server's own lateness against its schedule is reported beside: where it falls behind (the CPUs
it shares with the client are full), the client is offered fewer tokens/s than the schedule says.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rooftop.bench.datasets import Prompt
from rooftop.bench.level import make_session, run_level
from rooftop.bench.loadgen import LevelPlan, Target
from rooftop.bench.records import RequestRecord
from rooftop.bench.subproc import ChildServer, python_module

DEFAULT_LEVELS = (1, 16, 64, 256, 1024)
# The client's error targets, for TTFT and ITL alike: median under MEDIAN_TARGET_MS, p99 under P99_TARGET_MS.
MEDIAN_TARGET_MS = 1.0
P99_TARGET_MS = 5.0
# The synthetic server kept its schedule at a level while its median chunk went out less late than
# ON_SCHEDULE_MS or a fifth of the gap between tokens, whichever is more (an idle process on a VM wakes
# ~1 ms after its timer; a server that cannot keep up falls behind by whole gaps).
ON_SCHEDULE_MS = 2.0
# The synthetic server runs this much nicer than the client: where both want the machine's CPUs (on
# 2 cores at C=1024 they do), the client under test runs first and the server falls behind, which
# server_late_ms and tokens_per_s report; at equal priority the server, in a scheduling group of its
# own (autogroup), took half the CPUs and left each client process half a core at times, long enough
# for a stream's next token to land before its last was read.
SERVER_NICE = 19


def client_errors_ns(records: list[RequestRecord]) -> tuple[list[int], list[int]]:
    """Per-request TTFT errors and per-gap ITL errors in ns, from records with server stamps."""
    ttft, itl = [], []
    for r in _stamped(records):
        measured = r.chunk_ns[0] - r.decided_ns
        true = r.server_sent_ns[0] - r.server_received_ns
        ttft.append(measured - true)
        for i in range(1, len(r.chunk_ns)):
            itl.append((r.chunk_ns[i] - r.chunk_ns[i - 1]) - (r.server_sent_ns[i] - r.server_sent_ns[i - 1]))
    return ttft, itl


def server_lateness_ns(records: list[RequestRecord], ttft_ns: int, itl_ns: int) -> list[int]:
    """How late the server sent each chunk against its schedule (chunk i due ttft + i·itl after arrival)."""
    return [sent - (r.server_received_ns + ttft_ns + i * itl_ns)
            for r in _stamped(records) for i, sent in enumerate(r.server_sent_ns)]


def _stamped(records: list[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.ok and r.chunk_ns and r.server_received_ns is not None
            and len(r.server_sent_ns) == len(r.chunk_ns)]


@dataclass(slots=True)
class CalibrationLevel:
    concurrency: int
    requests: int
    failed: int
    ttft_error_ms: dict
    itl_error_ms: dict
    tokens_per_s: float
    server_late_ms: dict
    server_on_schedule: bool
    client_procs: int = 1

    @property
    def holds(self) -> bool:
        """Every request answered, and TTFT error (and ITL error, where there is a gap to time) within
        the targets: median under MEDIAN_TARGET_MS, p99 under P99_TARGET_MS."""
        def within(e: dict) -> bool:
            return e["median"] < MEDIAN_TARGET_MS and e["p99"] < P99_TARGET_MS

        return (self.failed == 0 and self.ttft_error_ms["n"] > 0 and within(self.ttft_error_ms)
                and (self.itl_error_ms["n"] == 0 or within(self.itl_error_ms)))

    def to_json_dict(self) -> dict:
        return {
            "concurrency": self.concurrency, "client_procs": self.client_procs, "requests": self.requests,
            "failed": self.failed, "ttft_error_ms": self.ttft_error_ms, "itl_error_ms": self.itl_error_ms,
            "tokens_per_s": round(self.tokens_per_s, 1), "holds": self.holds,
            "server_late_ms": self.server_late_ms, "server_on_schedule": self.server_on_schedule,
        }


def _dist_ms(values_ns: list[int]) -> dict:
    if not values_ns:
        return {"median": None, "p99": None, "n": 0}
    a = np.asarray(values_ns, dtype=np.float64) / 1e6
    return {"median": round(float(np.median(a)), 4), "p99": round(float(np.percentile(a, 99)), 4), "n": int(a.size)}


def level_result(concurrency: int, records: list[RequestRecord], wall_ns: int, *, ttft_ns: int, itl_ns: int,
                 client_procs: int = 1) -> CalibrationLevel:
    """One level's figures from its records; the server's schedule (ttft_ns, itl_ns) gives its lateness."""
    ttft, itl = client_errors_ns(records)
    tokens = sum(len(r.chunk_ns) for r in records if r.ok)
    late = _dist_ms(server_lateness_ns(records, ttft_ns, itl_ns))
    return CalibrationLevel(
        concurrency=concurrency, requests=len(records), failed=sum(1 for r in records if not r.ok),
        ttft_error_ms=_dist_ms(ttft), itl_error_ms=_dist_ms(itl), tokens_per_s=tokens / max(wall_ns, 1) * 1e9,
        server_late_ms=late, client_procs=client_procs,
        # Else the client was offered fewer tokens/s than the schedule says.
        server_on_schedule=late["n"] > 0 and late["median"] < max(ON_SCHEDULE_MS, itl_ns / 1e6 / 5),
    )


def holds_up_to(levels: list[CalibrationLevel]) -> CalibrationLevel | None:
    """The highest level at which the targets hold, and hold at every level below it too."""
    best = None
    for lv in sorted(levels, key=lambda lv: lv.concurrency):
        if not lv.holds:
            break
        best = lv
    return best


async def run_calibration(
    base_url: str, levels: list[int], *, output_len: int, requests_per_level: Callable[[int], int],
    ttft_ms: float, itl_ms: float, on_level: Callable[[int, int], None] | None = None,
    on_done: Callable | None = None, client_procs: int | None = None,
) -> list[CalibrationLevel]:
    """Sweep the levels against a running synthetic server whose schedule is (ttft_ms, itl_ms)."""
    prompt = [Prompt("calibrate " * 4, 40, output_len)]
    target = Target(base_url, "fake", force_length=True, timeout_s=120)
    results = []
    async with make_session(max(levels), client_procs) as session:
        await run_level(session, target, LevelPlan(concurrency=4, num_requests=8), prompt, warmup=True)
        for c in levels:
            n = requests_per_level(c)
            if on_level:
                on_level(c, n)
            run = await run_level(session, target, LevelPlan(concurrency=c, num_requests=n), prompt, on_done=on_done)
            results.append(level_result(c, run.records, run.end_ns - run.start_ns, ttft_ns=round(ttft_ms * 1e6),
                                        itl_ns=round(itl_ms * 1e6), client_procs=run.client_procs))
    return results


def calibrate(
    levels: list[int] | tuple[int, ...] = DEFAULT_LEVELS, *, ttft_ms: float = 20.0, itl_ms: float = 10.0, output_len: int = 32,
    on_level: Callable[[int, int], None] | None = None, on_done: Callable | None = None,
    client_procs: int | None = None, server_nice: int = SERVER_NICE,
) -> list[CalibrationLevel]:
    """Start the synthetic server as a separate process (as a real server would be), `server_nice`
    lower in CPU priority than this one, and sweep it; each level sends max(3·C, 48) requests."""
    argv = python_module("rooftop.bench.fakeserver", "--port", "0", "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms),
                         "--parent-pid", str(os.getpid()), "--nice", str(server_nice))
    with ChildServer(argv, "fakeserver ready") as server:
        return asyncio.run(run_calibration(
            server.url, levels, output_len=output_len, requests_per_level=lambda c: max(3 * c, 48),
            ttft_ms=ttft_ms, itl_ms=itl_ms, on_level=on_level, on_done=on_done, client_procs=client_procs,
        ))
