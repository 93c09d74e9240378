"""Client calibration: drive the synthetic server, whose every chunk carries its own send stamp,
and measure the load generator's own error (measured minus true) on TTFT and ITL.

True TTFT is what the server spent: first chunk sent minus request received. The client's error is
everything else it adds: getting the request out after deciding to send it, and noticing the chunk.
Both sides read CLOCK_MONOTONIC (time.perf_counter_ns) on one host, so the stamps compare directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rooftop.bench.datasets import Prompt
from rooftop.bench.loadgen import LevelPlan, Target, make_session, run_level
from rooftop.bench.records import RequestRecord
from rooftop.bench.subproc import ChildServer, python_module

DEFAULT_LEVELS = (1, 16, 64, 256)
THRESHOLD_MS = 1.0


def client_errors_ns(records: list[RequestRecord]) -> tuple[list[int], list[int]]:
    """Per-request TTFT errors and per-gap ITL errors in ns, from records with server stamps."""
    ttft, itl = [], []
    for r in records:
        if not r.ok or not r.chunk_ns or r.server_received_ns is None or len(r.server_sent_ns) != len(r.chunk_ns):
            continue
        measured = r.chunk_ns[0] - r.decided_ns
        true = r.server_sent_ns[0] - r.server_received_ns
        ttft.append(measured - true)
        for i in range(1, len(r.chunk_ns)):
            itl.append((r.chunk_ns[i] - r.chunk_ns[i - 1]) - (r.server_sent_ns[i] - r.server_sent_ns[i - 1]))
    return ttft, itl


@dataclass(slots=True)
class CalibrationLevel:
    concurrency: int
    requests: int
    failed: int
    ttft_error_ms: dict
    itl_error_ms: dict
    tokens_per_s: float

    def to_json_dict(self) -> dict:
        return {
            "concurrency": self.concurrency, "requests": self.requests, "failed": self.failed,
            "ttft_error_ms": self.ttft_error_ms, "itl_error_ms": self.itl_error_ms,
            "tokens_per_s": round(self.tokens_per_s, 1),
        }


def _dist_ms(values_ns: list[int]) -> dict:
    if not values_ns:
        return {"median": None, "p99": None, "n": 0}
    a = np.asarray(values_ns, dtype=np.float64) / 1e6
    return {"median": round(float(np.median(a)), 4), "p99": round(float(np.percentile(a, 99)), 4), "n": int(a.size)}


def level_result(concurrency: int, records: list[RequestRecord], wall_ns: int) -> CalibrationLevel:
    ttft, itl = client_errors_ns(records)
    tokens = sum(len(r.chunk_ns) for r in records if r.ok)
    return CalibrationLevel(
        concurrency=concurrency, requests=len(records), failed=sum(1 for r in records if not r.ok),
        ttft_error_ms=_dist_ms(ttft), itl_error_ms=_dist_ms(itl), tokens_per_s=tokens / max(wall_ns, 1) * 1e9,
    )


def best_level(levels: list[CalibrationLevel], threshold_ms: float = THRESHOLD_MS) -> CalibrationLevel | None:
    """The highest concurrency whose median TTFT error stays under the threshold."""
    good = [lv for lv in levels if lv.ttft_error_ms["median"] is not None and lv.ttft_error_ms["median"] < threshold_ms
            and lv.failed == 0]
    return max(good, key=lambda lv: lv.concurrency) if good else None


async def run_calibration(
    base_url: str, levels: list[int], *, output_len: int, requests_per_level: Callable[[int], int],
    on_level: Callable[[int, int], None] | None = None, on_done: Callable | None = None,
) -> list[CalibrationLevel]:
    """Sweep the levels against a running synthetic server."""
    prompt = [Prompt("calibrate " * 4, 40, output_len)]
    target = Target(base_url, "fake", force_length=True, timeout_s=120)
    results = []
    async with make_session(max(levels)) as session:
        await run_level(session, target, LevelPlan(concurrency=4, num_requests=8), prompt, warmup=True)
        for c in levels:
            n = requests_per_level(c)
            if on_level:
                on_level(c, n)
            run = await run_level(session, target, LevelPlan(concurrency=c, num_requests=n), prompt, on_done=on_done)
            results.append(level_result(c, run.records, run.end_ns - run.start_ns))
    return results


def calibrate(
    levels: list[int] | tuple[int, ...] = DEFAULT_LEVELS, *, ttft_ms: float = 20.0, itl_ms: float = 10.0, output_len: int = 32,
    on_level: Callable[[int, int], None] | None = None, on_done: Callable | None = None,
) -> list[CalibrationLevel]:
    """Start the synthetic server as a separate process (as a real server would be) and sweep it."""
    argv = python_module("rooftop.bench.fakeserver", "--port", "0", "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms))
    with ChildServer(argv, "fakeserver ready") as server:
        return asyncio.run(run_calibration(
            server.url, levels, output_len=output_len, requests_per_level=lambda c: max(3 * c, 48),
            on_level=on_level, on_done=on_done,
        ))
