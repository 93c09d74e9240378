"""The load generator: closed-loop concurrency levels and open-loop arrivals (Poisson or gamma, a ramp-up,
or a trace's own timestamps: `arrivals.py`), with repeats.

Latency starts when the generator *decides* to send a request: in a closed loop that is the moment
a virtual user is free again; in an open loop it is the request's scheduled arrival, so time spent
waiting for a concurrency slot (or behind a late event loop) counts against the server, not hidden.

A level runs in this process's event loop, or, past STREAMS_PER_PROC streams, split into shares over
client worker processes (`workers.py`), each with its own loop and connections; either way it comes
back as one list of records on one clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from rooftop.bench import client
from rooftop.bench.arrivals import gamma_offsets_ns, ramp_offsets_ns
from rooftop.bench.datasets import Prompt
from rooftop.bench.http import Pool
from rooftop.bench.records import ERR_CANCELLED, ERR_CONNECT, ERR_CUT_OFF, ERR_DISCONNECT, RequestRecord

# Requests in flight one event loop takes before a level is split over worker processes. A loop
# spends ~16 µs of CPU a streamed chunk on a 2-core VM (docs/perf/calibration.md): 256 streams of one
# token per 10 ms keep it under half busy, so that a burst (every stream's token at once) is read before
# the next token of the same stream lands on it and the kernel hands both over under one stamp.
STREAMS_PER_PROC = 256

# A level with a duration and no count issues requests until the duration ends, cycling through a pool
# of this many prompts (built before the level, like a counted level's): a server with a prefix cache
# sees a prompt again after this many requests.
PROMPT_POOL = 512
UNBOUNDED = 2**62  # the request-index stop of a level without a count: its duration bounds it

# Every level has a deadline; requests still in flight then are cut (error class cut_off, not a failure
# of the server). With a duration: the duration plus a grace of a quarter of it, at least GRACE_MIN_S and
# at most the request timeout. Without one: the time its requests take if each runs to the timeout, one
# wave of users (or of the cap) after another, plus DEADLINE_SLACK_S.
GRACE_FRACTION = 0.25
GRACE_MIN_S = 10.0
DEADLINE_SLACK_S = 10.0

# The server is taken for gone (the sweep stops) when a new connection is refused, when a probe of its
# port after a dropped connection is refused, or after this many dropped connections in a row with no
# answered request between them. A single dropped connection is that request's failure.
DISCONNECTS_IN_A_ROW = 8
PROBE_TIMEOUT_S = 2.0

# An open loop sleeps until this long before an arrival, then yields to the event loop until it is due: the
# loop's timers wait in epoll, whose timeout is whole milliseconds rounded up, so a plain sleep sends up to
# 1 ms late (0.8 ms at the median on a 2-core VM); the last stretch costs a little CPU instead
# (docs/perf/trace-schedule-cpu.md).
SPIN_NS = 1_000_000


@dataclass(slots=True)
class LevelPlan:
    """One level of a sweep: a closed-loop concurrency, or an open-loop rate with an optional cap (its
    arrivals drawn with a burstiness, on a ramp-up, or given by a trace)."""

    concurrency: int | None = None  # closed loop: this many virtual users
    # open loop: arrivals at this many requests/s (a ramp's or a trace's: the mean rate of its schedule)
    request_rate: float | None = None
    max_concurrency: int | None = None  # open loop: optional cap on requests in flight
    num_requests: int | None = 64  # None: no count, the duration bounds the level
    duration_s: float | None = None  # stop issuing after this long (then num_requests is a cap)
    grace_s: float | None = None  # past duration_s, how long requests in flight may finish (None: the default)
    burstiness: float = 1.0  # open loop: gamma shape of the gaps (1: Poisson)
    ramp: tuple[str, float, float] | None = None  # open loop: (strategy, start rps, end rps) over the requests
    schedule_ns: list[int] | None = None  # trace replay: request i is due at the start + schedule_ns[i]
    name: str | None = None  # the label's first words where they are not a rate ("trace mooncake x2")
    multi_turn: bool = False  # sessions of turns (conversations.py): concurrency is sessions in flight
    think_time_s: float = 0.0  # multi-turn: from a reply to the session's next turn

    @property
    def label(self) -> str:
        if self.request_rate is not None:
            cap = f", cap {self.max_concurrency}" if self.max_concurrency else ""
            if self.name:
                return f"{self.name}{cap}"
            if self.ramp:
                return f"ramp {self.ramp[0]} {self.ramp[1]:g}→{self.ramp[2]:g}/s{self._bursty()}{cap}"
            return f"rate {self.request_rate:g}/s{self._bursty()}{cap}"
        return f"C={self.concurrency}"

    def _bursty(self) -> str:
        return f", burstiness {self.burstiness:g}" if self.burstiness != 1.0 else ""

    def grace(self, timeout_s: float) -> float:
        """Seconds past duration_s that requests in flight get before the level cuts them."""
        if self.grace_s is not None:
            return self.grace_s
        return min(timeout_s, max(GRACE_MIN_S, GRACE_FRACTION * (self.duration_s or 0.0)))

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
    headers: dict = field(default_factory=dict)  # e.g. the API key's Authorization (auth.py)

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
    spec_decode: dict | None = None  # speculative decoding over the level (engine_metrics.spec_decode_delta)
    server_spans: dict | None = None  # --otlp-receiver: how its records joined the server's spans (latency.join)
    client_procs: int = 1  # event loops (processes) that ran the level


class Cycled(Sequence):
    """pool[indices[k] % len(pool)] for each k: a level without a count cycles through its prompts (and
    their encoded bodies) without a list as long as its requests."""

    __slots__ = ("pool", "indices")

    def __init__(self, pool: list, indices: Sequence[int]):
        self.pool, self.indices = pool, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        return self.pool[self.indices[k] % len(self.pool)]


@dataclass(slots=True)
class Share:
    """The part of a level one event loop runs: its requests in order, and its users or its cap."""

    indices: Sequence[int]  # the level's request indices, in the order this loop issues them (a range: no count)
    prompts: Sequence[Prompt]  # prompts[k] is request indices[k]'s
    users: int  # closed loop: virtual users; open loop: cap on requests in flight (0: none)
    arrivals_ns: list[int] | None = None  # open loop: indices[k] is due at the level's start + arrivals_ns[k]
    # open loop whose duration ended its schedule (not its count): the level lasts the duration, idle after
    # its last arrival's answer if it comes to that, so its rates are over the time the load was offered
    hold_to_duration: bool = False


def arrival_offsets_ns(rate: float, n: int | None, seed: int, until_s: float | None = None,
                       burstiness: float = 1.0) -> list[int]:
    """The open loop's schedule: Poisson arrivals at `rate`/s (gamma gaps of shape `burstiness` where it
    is not 1), the first at 0, seeded; n of them, or (with `until_s`) those before until_s, at most n."""
    return gamma_offsets_ns(rate, n, seed, until_s, burstiness)


def level_offsets_ns(plan: LevelPlan, seed: int) -> list[int]:
    """An open-loop level's schedule: a trace's own (cut to the level's count and duration), a ramp-up's,
    or arrivals at its rate."""
    if plan.schedule_ns is not None:
        end = None if plan.duration_s is None else int(plan.duration_s * 1e9)
        due = [t for t in plan.schedule_ns if end is None or t < end]
        return due if plan.num_requests is None else due[:plan.num_requests]
    if plan.ramp is not None:
        strategy, start_rps, end_rps = plan.ramp
        return ramp_offsets_ns(strategy, start_rps, end_rps, plan.num_requests, seed, plan.duration_s,
                               plan.burstiness)
    return arrival_offsets_ns(plan.request_rate, plan.num_requests, seed, plan.duration_s, plan.burstiness)


def prompts_needed(plan: LevelPlan, seed: int) -> int:
    """Prompts to build for a level: one per request, or a pool of PROMPT_POOL it cycles through where a
    duration alone bounds it (an open loop's arrivals within its duration are known before it runs)."""
    if plan.request_rate is not None:
        n = len(level_offsets_ns(plan, seed))
        return max(1, n if plan.num_requests is not None else min(n, PROMPT_POOL))
    return plan.num_requests if plan.num_requests is not None else PROMPT_POOL


def _split_evenly(total: int, parts: int) -> list[int]:
    return [total // parts + (k < total % parts) for k in range(parts)]


def split_level(plan: LevelPlan, prompts: list[Prompt], seed: int, procs: int) -> list[Share]:
    """The level's requests dealt to `procs` event loops (fewer when it has fewer users or requests).

    Closed loop: the users split evenly, and request i goes with user i mod C, so each loop's share
    of requests follows its share of users. Open loop: one seeded schedule dealt round-robin, the
    cap split evenly.
    """
    if plan.request_rate is None and plan.num_requests is None:  # a duration bounds it: no list of requests
        users = plan.concurrency or 1
        procs = max(1, min(procs, users))
        per_proc = _split_evenly(users, procs)
        out = []
        for k in range(procs):
            idx = range(k, UNBOUNDED, procs)
            out.append(Share(idx, Cycled(prompts, idx), per_proc[k]))
        return out
    if plan.request_rate is not None:
        arrivals = level_offsets_ns(plan, seed)
        n = len(arrivals)
    else:
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
    cap = plan.max_concurrency or 0
    procs = max(1, min(procs, n or 1, cap or n or 1))
    caps = _split_evenly(cap, procs) if cap else [0] * procs
    hold = plan.duration_s is not None and (plan.num_requests is None or n < plan.num_requests)
    return [Share(list(range(k, n, procs)), prompt[k::procs], caps[k], arrivals[k::procs], hold)
            for k in range(procs)]


def prepare_bodies(target: Target, share: Share) -> Sequence[client.Prepared]:
    """Every request body of a share, encoded before the level's clock starts (bodies[k] is request k's)."""
    def encode(p: Prompt) -> client.Prepared:
        return client.prepare(client.build_payload(
            chat=target.chat, model=target.model, prompt=p.text, max_tokens=p.output_len,
            stream=target.stream, force_length=target.force_length, extra=target.extra_body))

    if isinstance(share.prompts, Cycled):  # no count: each prompt of the pool encoded once
        return Cycled([encode(p) for p in share.prompts.pool], share.prompts.indices)
    cache: dict[int, client.Prepared] = {}  # a prompt used again (prompts[i % len]) is encoded once
    out = []
    for p in share.prompts:
        if id(p) not in cache:
            cache[id(p)] = encode(p)
        out.append(cache[id(p)])
    return out


def level_deadline_ns(plan: LevelPlan, share: Share, start_ns: int, timeout_s: float) -> int:
    """When a share's requests still in flight are cut (GRACE_FRACTION above says how it is set)."""
    if plan.duration_s is not None:
        return start_ns + int((plan.duration_s + plan.grace(timeout_s)) * 1e9)
    n = len(share.indices)
    waves = math.ceil(n / share.users) if share.users else 1
    last_arrival = share.arrivals_ns[-1] if share.arrivals_ns else 0
    return start_ns + last_arrival + int((waves * timeout_s + DEADLINE_SLACK_S) * 1e9)


async def server_refuses(url: str) -> bool:
    """Whether a new TCP connection to url's host and port is refused (or cannot be made in
    PROBE_TIMEOUT_S): the server is gone, not one connection of it."""
    u = urlsplit(url)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(u.hostname or "127.0.0.1", u.port or 80),
                                           PROBE_TIMEOUT_S)
    except (OSError, TimeoutError):
        return True
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


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
    cut_ns = level_deadline_ns(plan, share, start_ns, target.timeout_s)
    last_decided = [start_ns]
    dropped_in_a_row = [0]

    def new_record(k: int, decided_ns: int) -> RequestRecord:
        p = share.prompts[k]
        rec = RequestRecord(
            index=share.indices[k], concurrency=plan.concurrency or plan.max_concurrency,
            request_rate=plan.request_rate, repeat=repeat, warmup=warmup, decided_ns=decided_ns,
            # an open loop decides on its schedule: the send was due then, whenever it went (sent_ns)
            scheduled_ns=decided_ns if share.arrivals_ns is not None else None,
            expected_input_len=p.input_len, expected_output_len=p.output_len, streamed=target.stream,
        )
        records.append(rec)
        last_decided[0] = decided_ns
        return rec

    async def one(k: int, rec: RequestRecord) -> None:
        await client.send(pool, target.url, bodies[k], rec, target.timeout_s, target.headers)
        if rec.error_class == ERR_CONNECT and not abort:
            abort.append(f"{rec.error_class}: {rec.error}")  # nothing listens there any more
        elif rec.error_class == ERR_DISCONNECT:
            dropped_in_a_row[0] += 1
            if not abort and dropped_in_a_row[0] >= DISCONNECTS_IN_A_ROW:
                abort.append(f"{dropped_in_a_row[0]} connections in a row dropped ({rec.error})")
            elif not abort and await server_refuses(target.url):
                abort.append(f"{rec.error_class}: {rec.error}, and a new connection was refused")
        elif rec.http_status is not None:
            dropped_in_a_row[0] = 0  # the server answered
        if on_done is not None:
            on_done(rec)

    def may_issue(k: int) -> bool:
        if abort or k >= len(share.indices):
            return False
        return deadline_ns is None or time.perf_counter_ns() < deadline_ns

    async def issue() -> None:
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
            await _open_loop(share, start_ns, deadline_ns, may_issue, new_record, one)
            if share.hold_to_duration and deadline_ns is not None and not abort:
                await asyncio.sleep(max(0, deadline_ns - time.perf_counter_ns()) / 1e9)

    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection pause mid-level would land in some request's latency
    work = asyncio.ensure_future(issue())
    try:
        done, _ = await asyncio.wait({work}, timeout=max(0, cut_ns - time.perf_counter_ns()) / 1e9)
        if not done:  # the level's deadline: what is still in flight is cut, not failed
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            for rec in records:
                if rec.error_class == ERR_CANCELLED or (rec.error_class is None and not rec.ok):
                    rec.error_class = ERR_CUT_OFF
                    rec.error = "cut at the level's deadline (--duration plus its grace, or the count's bound)"
                    rec.end_ns = rec.end_ns or time.perf_counter_ns()
        else:
            work.result()
    except asyncio.CancelledError:
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        for rec in records:  # those still waiting for a cap's slot were never sent
            if rec.error_class is None and not rec.ok:
                rec.error_class, rec.error = ERR_CANCELLED, "run interrupted before it was sent"
                rec.end_ns = rec.end_ns or time.perf_counter_ns()
        abort.append("interrupted")
        raise
    finally:
        if gc_was_enabled:
            gc.enable()
    return last_decided[0], abort[0] if abort else None


async def _open_loop(share: Share, start_ns: int, deadline_ns: int | None, may_issue, new_record, one) -> None:
    """Arrivals on the share's schedule; a cap makes late requests wait, and it counts. An arrival due
    after the level's duration is not waited for."""
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
            if deadline_ns is not None and arrival >= deadline_ns:
                break
            delay = arrival - time.perf_counter_ns()
            if delay > SPIN_NS:
                await asyncio.sleep((delay - SPIN_NS) / 1e9)
            while time.perf_counter_ns() < arrival:
                await asyncio.sleep(0)  # the event loop still serves the streams in flight meanwhile
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
