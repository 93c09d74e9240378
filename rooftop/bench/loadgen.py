"""The load generator: closed-loop concurrency levels and open-loop Poisson arrivals, with repeats.

Latency starts when the generator *decides* to send a request: in a closed loop that is the moment
a virtual user is free again; in an open loop it is the request's scheduled arrival, so time spent
waiting for a concurrency slot (or behind a late event loop) counts against the server, not hidden.

A level runs in this process's event loop, or, past STREAMS_PER_PROC streams, split into shares over
client worker processes (`workers.py`), each with its own loop and connections; either way it comes
back as one list of records on one clock.
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rooftop.bench import client
from rooftop.bench.datasets import Prompt
from rooftop.bench.http import Pool
from rooftop.bench.records import SERVER_GONE, RequestRecord

if TYPE_CHECKING:
    from rooftop.bench.workers import Session

# Requests in flight one event loop takes before a level is split over worker processes. A loop
# spends ~16 µs of CPU a streamed chunk on a 2-core VM (docs/perf/calibration.md): 256 streams of one
# token per 10 ms keep it under half busy, so that a burst (every stream's token at once) is read before
# the next token of the same stream lands on it and the kernel hands both over under one stamp.
STREAMS_PER_PROC = 256


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

    @property
    def streams(self) -> int:
        """Requests this level keeps in flight at most (0: an uncapped open loop, no fixed number)."""
        return self.concurrency or self.max_concurrency or 0


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
    client_procs: int = 1  # event loops (processes) that ran the level


@dataclass(slots=True)
class Share:
    """The part of a level one event loop runs: its requests in order, and its users or its cap."""

    indices: list[int]  # the level's request indices, in the order this loop issues them
    prompts: list[Prompt]  # prompts[k] is request indices[k]'s
    users: int  # closed loop: virtual users; open loop: cap on requests in flight (0: none)
    arrivals_ns: list[int] | None = None  # open loop: indices[k] is due at the level's start + arrivals_ns[k]


def arrival_offsets_ns(rate: float, n: int, seed: int) -> list[int]:
    """The open loop's schedule: n Poisson arrivals at `rate`/s, the first at 0, seeded."""
    rng = random.Random(seed)
    out, t = [], 0
    for _ in range(n):
        out.append(t)
        t += int(rng.expovariate(rate) * 1e9)
    return out


def _split_evenly(total: int, parts: int) -> list[int]:
    return [total // parts + (k < total % parts) for k in range(parts)]


def split_level(plan: LevelPlan, prompts: list[Prompt], seed: int, procs: int) -> list[Share]:
    """The level's requests dealt to `procs` event loops (fewer when it has fewer users or requests).

    Closed loop: the users split evenly, and request i goes with user i mod C, so each loop's share
    of requests follows its share of users. Open loop: one seeded schedule dealt round-robin, the
    cap split evenly.
    """
    n = plan.num_requests
    prompt = [prompts[i % len(prompts)] for i in range(n)]
    if plan.request_rate is None:
        users = min(plan.concurrency or 1, n)
        procs = max(1, min(procs, users))
        owner = [u % procs for u in range(users)]
        per_proc = _split_evenly(users, procs)
        shares = [Share([], [], per_proc[k]) for k in range(procs)]
        for i in range(n):
            s = shares[owner[i % users]]
            s.indices.append(i)
            s.prompts.append(prompt[i])
        return shares
    arrivals = arrival_offsets_ns(plan.request_rate, n, seed)
    cap = plan.max_concurrency or 0
    procs = max(1, min(procs, n, cap or n))
    caps = _split_evenly(cap, procs) if cap else [0] * procs
    return [Share(list(range(k, n, procs)), prompt[k::procs], caps[k], arrivals[k::procs]) for k in range(procs)]


def procs_for(plan: LevelPlan, client_procs: int | None = None) -> int:
    """Event loops for a level: `client_procs` when given, else one per STREAMS_PER_PROC streams, at
    most one per CPU this process may run on. An uncapped open loop runs in one unless told."""
    if client_procs:
        return client_procs
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(math.ceil(plan.streams / STREAMS_PER_PROC), cpus))


def make_session(limit: int = 0, client_procs: int | None = None) -> Session:
    """One client per run: connections open as levels need them (`limit` is advisory); worker
    processes start when a level needs more than one event loop (`client_procs`: None decides per level)."""
    from rooftop.bench.workers import Session  # workers.py imports this module

    return Session(client_procs)


async def run_level(
    session: Session,
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
    """Run one level to completion and return every request it sent, finished or failed, in the order
    they were decided.

    In this process, records are appended to `records` (when given) as requests are issued; over
    worker processes, as they end, and those cut off when the level stops. Either way a caller that
    is interrupted still holds every request that went out.
    """
    records = [] if records is None else records
    procs = procs_for(plan, session.client_procs)
    if procs > 1:
        return await session.workers.run_level(procs, target, plan, prompts, repeat=repeat, warmup=warmup,
                                               seed=seed, on_done=on_done, records=records)
    (share,) = split_level(plan, prompts, seed, 1)
    bodies = prepare_bodies(target, share)
    try:
        await session.pool.prewarm(target.url, plan.streams or 1)
    except OSError:
        pass  # nothing listening: the requests themselves will record it
    gc.collect()
    start_ns = time.perf_counter_ns()
    last_decided, aborted = await run_share(session.pool, target, plan, share, bodies, start_ns, repeat=repeat,
                                            warmup=warmup, on_done=on_done, records=records)
    return LevelRun(plan, repeat, records, start_ns, time.perf_counter_ns(), last_decided, aborted)


def prepare_bodies(target: Target, share: Share) -> list[client.Prepared]:
    """Every request body of a share, encoded before the level's clock starts (bodies[k] is request k's)."""
    cache: dict[int, client.Prepared] = {}  # a prompt used again (prompts[i % len]) is encoded once
    out = []
    for p in share.prompts:
        if id(p) not in cache:
            cache[id(p)] = client.prepare(client.build_payload(
                chat=target.chat, model=target.model, prompt=p.text, max_tokens=p.output_len,
                stream=target.stream, force_length=target.force_length, extra=target.extra_body))
        out.append(cache[id(p)])
    return out


async def run_share(
    pool: Pool,
    target: Target,
    plan: LevelPlan,
    share: Share,
    bodies: list[client.Prepared],
    start_ns: int,
    *,
    repeat: int,
    warmup: bool,
    on_done: Callable[[RequestRecord], None] | None,
    records: list[RequestRecord],
) -> tuple[int, str | None]:
    """Run one event loop's share of a level from `start_ns`; returns (when it last decided to send,
    why it stopped early or None). Records are appended to `records` as requests are issued."""
    abort: list[str] = []
    deadline_ns = start_ns + int(plan.duration_s * 1e9) if plan.duration_s is not None else None
    last_decided = [start_ns]

    def new_record(k: int, decided_ns: int) -> RequestRecord:
        p = share.prompts[k]
        rec = RequestRecord(
            index=share.indices[k], concurrency=plan.concurrency or plan.max_concurrency,
            request_rate=plan.request_rate, repeat=repeat, warmup=warmup, decided_ns=decided_ns,
            expected_input_len=p.input_len, expected_output_len=p.output_len, streamed=target.stream,
        )
        records.append(rec)
        last_decided[0] = decided_ns
        return rec

    async def one(k: int, rec: RequestRecord) -> None:
        await client.send(pool, target.url, bodies[k], rec, target.timeout_s)
        if rec.error_class in SERVER_GONE and not abort:
            abort.append(f"{rec.error_class}: {rec.error}")
        if on_done is not None:
            on_done(rec)

    def may_issue(k: int) -> bool:
        if abort or k >= len(share.indices):
            return False
        return deadline_ns is None or time.perf_counter_ns() < deadline_ns

    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection pause mid-level would land in some request's latency
    try:
        if share.arrivals_ns is None:
            counter = iter(range(len(share.indices)))

            async def user() -> None:
                while True:
                    k = next(counter, None)
                    if k is None or not may_issue(k):
                        return
                    await one(k, new_record(k, time.perf_counter_ns()))

            await asyncio.gather(*(user() for _ in range(min(share.users, len(share.indices)))))
        else:
            await _open_loop(share, start_ns, may_issue, new_record, one)
    except asyncio.CancelledError:
        abort.append("interrupted")
        raise
    finally:
        if gc_was_enabled:
            gc.enable()
    return last_decided[0], abort[0] if abort else None


async def _open_loop(share: Share, start_ns: int, may_issue, new_record, one) -> None:
    """Arrivals on the share's schedule; a cap makes late requests wait, and it counts."""
    sem = asyncio.Semaphore(share.users) if share.users else None
    tasks: list[asyncio.Task] = []

    async def capped(k: int, rec: RequestRecord) -> None:
        if sem is None:
            await one(k, rec)
            return
        async with sem:
            await one(k, rec)

    try:
        k = 0
        while may_issue(k):
            arrival = start_ns + share.arrivals_ns[k]
            delay = arrival - time.perf_counter_ns()
            if delay > 0:
                await asyncio.sleep(delay / 1e9)
            if not may_issue(k):
                break
            tasks.append(asyncio.create_task(capped(k, new_record(k, arrival))))
            k += 1
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
