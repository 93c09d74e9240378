"""The load generator: closed-loop concurrency levels and open-loop Poisson arrivals, with repeats.

Latency starts when the generator *decides* to send a request: in a closed loop that is the moment
a virtual user is free again; in an open loop it is the request's scheduled arrival, so time spent
waiting for a concurrency slot (or behind a late event loop) counts against the server, not hidden.
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rooftop.bench import client
from rooftop.bench.datasets import Prompt
from rooftop.bench.http import Pool
from rooftop.bench.records import SERVER_GONE, RequestRecord


@dataclass(slots=True)
class LevelPlan:
    """One level of a sweep: a closed-loop concurrency, or an open-loop rate with an optional cap."""

    concurrency: int | None = None  # closed loop: this many virtual users
    request_rate: float | None = None  # open loop: Poisson arrivals at this many requests/s
    max_concurrency: int | None = None  # open loop: optional cap on requests in flight
    num_requests: int = 64
    duration_s: float | None = None  # stop issuing after this long (then num_requests is a cap)

    @property
    def label(self) -> str:
        if self.request_rate is not None:
            cap = f", cap {self.max_concurrency}" if self.max_concurrency else ""
            return f"rate {self.request_rate:g}/s{cap}"
        return f"C={self.concurrency}"


@dataclass(slots=True)
class Target:
    """Where and how to send: the endpoint URL and the body settings."""

    base_url: str
    model: str
    chat: bool = False
    stream: bool = True
    force_length: bool = True
    timeout_s: float = 600.0
    extra_body: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        path = "/v1/chat/completions" if self.chat else "/v1/completions"
        return self.base_url.rstrip("/") + path


@dataclass(slots=True)
class LevelRun:
    """What one level of one repeat produced; times in perf_counter_ns."""

    plan: LevelPlan
    repeat: int
    records: list[RequestRecord]
    start_ns: int
    end_ns: int
    last_decided_ns: int  # the generator stopped issuing here (the steady window's end)
    aborted: str | None = None  # why the level stopped early (server gone, interrupted)
    engine_steps: dict | None = None  # rooftop's engine: its step times over the level (engine_metrics.step_delta)
    engine_server: dict | None = None  # vLLM/SGLang: their own latency histograms over the level


def make_session(limit: int = 0) -> Pool:
    """One connection pool per run (connections open as levels need them; `limit` is advisory)."""
    return Pool()


async def run_level(
    session: Pool,
    target: Target,
    plan: LevelPlan,
    prompts: list[Prompt],
    *,
    repeat: int = 0,
    warmup: bool = False,
    seed: int = 0,
    on_done: Callable[[RequestRecord], None] | None = None,
    records: list[RequestRecord] | None = None,
) -> LevelRun:
    """Run one level to completion and return every request it sent, finished or failed.

    Records are appended to `records` (when given) as requests are issued, so a caller that is
    interrupted still holds every request that went out.
    """
    records = [] if records is None else records
    abort: list[str] = []
    n = plan.num_requests
    deadline_ns = (
        time.perf_counter_ns() + int(plan.duration_s * 1e9) if plan.duration_s is not None else None
    )

    def new_record(i: int, decided_ns: int) -> RequestRecord:
        p = prompts[i % len(prompts)]
        rec = RequestRecord(
            index=i, concurrency=plan.concurrency or plan.max_concurrency,
            request_rate=plan.request_rate, repeat=repeat, warmup=warmup, decided_ns=decided_ns,
            expected_input_len=p.input_len, expected_output_len=p.output_len,
        )
        records.append(rec)
        return rec

    async def one(i: int, rec: RequestRecord) -> None:
        p = prompts[i % len(prompts)]
        body = client.build_payload(
            chat=target.chat, model=target.model, prompt=p.text, max_tokens=p.output_len,
            stream=target.stream, force_length=target.force_length, extra=target.extra_body,
        )
        await client.send(session, target.url, body, rec, target.timeout_s)
        if rec.error_class in SERVER_GONE and not abort:
            abort.append(f"{rec.error_class}: {rec.error}")
        if on_done is not None:
            on_done(rec)

    def may_issue(i: int) -> bool:
        if abort or i >= n:
            return False
        return deadline_ns is None or time.perf_counter_ns() < deadline_ns

    try:
        await session.prewarm(target.url, plan.concurrency or plan.max_concurrency or 1)
    except OSError:
        pass  # nothing listening: the requests themselves will record it
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection pause mid-level would land in some request's latency
    start_ns = time.perf_counter_ns()
    last_decided = [start_ns]
    try:
        if plan.request_rate is None:
            counter = iter(range(n))

            async def user() -> None:
                while True:
                    i = next(counter, None)
                    if i is None or not may_issue(i):
                        return
                    decided = time.perf_counter_ns()
                    last_decided[0] = decided
                    await one(i, new_record(i, decided))

            await asyncio.gather(*(user() for _ in range(min(plan.concurrency or 1, n))))
        else:
            await _open_loop(plan, seed, may_issue, new_record, one, last_decided)
    except asyncio.CancelledError:
        abort.append("interrupted")
        raise
    finally:
        if gc_was_enabled:
            gc.enable()
    end_ns = time.perf_counter_ns()
    return LevelRun(plan, repeat, records, start_ns, end_ns, last_decided[0], abort[0] if abort else None)


async def _open_loop(plan, seed, may_issue, new_record, one, last_decided) -> None:
    """Poisson arrivals on a schedule fixed in advance; a cap makes late requests wait, and it counts."""
    rng = random.Random(seed)
    sem = asyncio.Semaphore(plan.max_concurrency) if plan.max_concurrency else None
    tasks: list[asyncio.Task] = []
    t0 = time.perf_counter_ns()
    arrival = t0
    i = 0

    async def capped(idx: int, rec: RequestRecord) -> None:
        if sem is None:
            await one(idx, rec)
            return
        async with sem:
            await one(idx, rec)

    try:
        while may_issue(i):
            delay = arrival - time.perf_counter_ns()
            if delay > 0:
                await asyncio.sleep(delay / 1e9)
            if not may_issue(i):
                break
            last_decided[0] = arrival
            tasks.append(asyncio.create_task(capped(i, new_record(i, arrival))))
            i += 1
            arrival += int(rng.expovariate(plan.request_rate) * 1e9)
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
