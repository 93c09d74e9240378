"""One level of load, in this process or dealt to client worker processes (`workers.py`) past
STREAMS_PER_PROC streams: the entry point of the load path (`make_session`, `run_level`)."""

from __future__ import annotations

import gc
import math
import os
import time
from collections.abc import Callable

from rooftop.bench.conversations import Session as Conversation
from rooftop.bench.conversations import run_sessions
from rooftop.bench.datasets import Prompt
from rooftop.bench.loadgen import (
    STREAMS_PER_PROC,
    LevelPlan,
    LevelRun,
    Target,
    level_deadline_ns,
    prepare_bodies,
    run_share,
    split_level,
)
from rooftop.bench.records import RequestRecord
from rooftop.bench.workers import Session


def procs_for(plan: LevelPlan, client_procs: int | None = None) -> int:
    """Event loops for a level: `client_procs` when given, else one per STREAMS_PER_PROC streams, at
    most one per CPU this process may run on. An uncapped open loop runs in one unless told, and multi-turn
    sessions always in one."""
    if plan.multi_turn:
        return 1
    if client_procs:
        return client_procs
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(math.ceil(plan.streams / STREAMS_PER_PROC), cpus))


def make_session(limit: int = 0, client_procs: int | None = None) -> Session:
    """One client per run: connections open as levels need them (`limit` is advisory); worker
    processes start when a level needs more than one event loop (`client_procs`: None decides per level)."""
    return Session(client_procs)


async def run_level(
    session: Session,
    target: Target,
    plan: LevelPlan,
    prompts: list[Prompt] | list[Conversation],
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
    if plan.multi_turn:
        return await _run_sessions(session, target, plan, prompts, repeat=repeat, warmup=warmup, seed=seed,
                                   on_done=on_done, records=records)
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
    # A level cut at its deadline ends there (cancelling what was in flight takes a moment more).
    end_ns = min(time.perf_counter_ns(), level_deadline_ns(plan, share, start_ns, target.timeout_s))
    return LevelRun(plan, repeat, records, start_ns, end_ns, last_decided, aborted)


async def _run_sessions(session: Session, target: Target, plan: LevelPlan, conversations: list[Conversation], *,
                        repeat: int, warmup: bool, seed: int, on_done, records: list[RequestRecord]) -> LevelRun:
    """A multi-turn level, in this process (conversations.py)."""
    try:
        await session.pool.prewarm(target.url, plan.streams or 1)
    except OSError:
        pass  # nothing listening: the requests themselves will record it
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection pause mid-level would land in some request's latency
    start_ns = time.perf_counter_ns()
    try:
        last_decided, aborted = await run_sessions(session.pool, target, plan, conversations, start_ns, repeat=repeat,
                                                   warmup=warmup, seed=seed, on_done=on_done, records=records)
    finally:
        if gc_was_enabled:
            gc.enable()
    return LevelRun(plan, repeat, records, start_ns, time.perf_counter_ns(), last_decided, aborted)
