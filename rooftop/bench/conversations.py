"""Multi-turn sessions: each turn sends the session's history (its earlier user turns and the model's own replies)
plus the new turn, so the context grows turn by turn, and a prefix cache can serve what came before.

Sessions interleave under a closed loop (the level's concurrency is sessions in flight: each virtual user runs
one session after another) or an open loop (a session starts on the arrival schedule; `--max-concurrency` caps
requests in flight). A turn is decided when the reply before it ended plus the think time (the session's first
turn: when its user was free, or its arrival). A turn that fails ends its session: there is no reply to go on
with. Conversation levels run in one client process.

History on /v1/chat/completions is the messages themselves; on /v1/completions the text as it was sent and
received, each new turn after a blank line: turn k+1's prompt starts with turn k's prompt and its reply.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rooftop.bench import client
from rooftop.bench.datasets import Prompt, random_prompts, read_entries
from rooftop.bench.http import Pool
from rooftop.bench.loadgen import (
    DEADLINE_SLACK_S,
    SPIN_NS,
    LevelPlan,
    Target,
    level_offsets_ns,
)
from rooftop.bench.records import ERR_CANCELLED, ERR_CONNECT, ERR_CUT_OFF, RequestRecord
from rooftop.errors import RooftopError

TURN_SEPARATOR = "\n\n"  # completions: between a reply and the next user turn


@dataclass(slots=True)
class Session:
    """One conversation: its user turns in order (text, tokens, and the length of the reply each asks for)."""

    turns: list[Prompt]


async def synthetic_sessions(tok, n: int, turns: int, turn_input_len: int, turn_output_len: int,
                             seed: int) -> list[Session]:
    """n sessions of `turns` turns, each turn's new text exactly turn_input_len tokens (as a prompt counts)."""
    texts = await random_prompts(tok, n * turns, turn_input_len, turn_output_len, seed)
    return [Session(texts[i * turns:(i + 1) * turns]) for i in range(n)]


def _user_turns(entry) -> list[tuple[str, str]] | None:
    """(user text, reply text) of each exchange of a ShareGPT ({"conversations": [{"from", "value"}]}) or OpenAI
    ({"messages": [{"role", "content"}]}) entry, from its first user turn; None when it is not one."""
    if not isinstance(entry, dict):
        return None
    turns, who, text = ((entry.get("conversations"), "from", "value") if "conversations" in entry
                        else (entry.get("messages"), "role", "content"))
    if not isinstance(turns, list) or not all(isinstance(t, dict) and isinstance(t.get(text), str) for t in turns):
        return None
    users, out = ("human", "user"), []
    for a, b in zip(turns, turns[1:], strict=False):
        if a.get(who) in users and b.get(who) not in users:
            out.append((a[text], b[text]))
    return out


async def sharegpt_sessions(tok, path: str | Path, n: int, seed: int, output_len: int | None,
                            dropped: dict | None = None) -> list[Session]:
    """n of ShareGPT's conversations of two exchanges or more, seeded; each human turn a turn, its reply's length
    (or `output_len`) the length it asks for. Fewer conversations than n are used again in order."""
    p = Path(path)
    if not p.is_file():
        raise RooftopError(f"ShareGPT file {p} not found", "pass --dataset-path to a local ShareGPT JSON file")
    entries = read_entries(p)
    convs = [c for c in (_user_turns(e) for e in entries) if c and len(c) >= 2]
    if dropped is not None:
        dropped["single_turn"] = len(entries) - len(convs)
    if not convs:
        raise RooftopError(f"{p} holds no conversation of two exchanges or more",
                           "use ShareGPT's multi-turn conversations, or --dataset conversation for synthetic ones")
    random.Random(seed).shuffle(convs)
    out = []
    for conv in convs[:n]:
        turns = []
        for question, answer in conv:
            n_out = output_len or max(1, await tok.count(answer, False))
            turns.append(Prompt(question, await tok.count(question, True), n_out))
        out.append(Session(turns))
    return [out[i % len(out)] for i in range(n)]


def turn_body(target: Target, history: list[tuple[str, str]], turn: Prompt) -> dict:
    """The request of a turn: the history (user text, reply) so far, then the new turn."""
    if target.chat:
        messages = [m for user, reply in history for m in ({"role": "user", "content": user},
                                                           {"role": "assistant", "content": reply})]
        body = client.build_payload(chat=True, model=target.model, prompt=turn.text, max_tokens=turn.output_len,
                                    stream=target.stream, force_length=target.force_length, extra=target.extra_body)
        body["messages"] = [*messages, *body["messages"]]
        return body
    text = "".join(user + reply + TURN_SEPARATOR for user, reply in history) + turn.text
    return client.build_payload(chat=False, model=target.model, prompt=text, max_tokens=turn.output_len,
                                stream=target.stream, force_length=target.force_length, extra=target.extra_body)


def session_starts_ns(plan: LevelPlan, n: int, seed: int) -> list[int] | None:
    """An open loop's session starts (its arrival schedule for n sessions); None for a closed loop."""
    if plan.request_rate is None:
        return None
    return level_offsets_ns(dataclasses.replace(plan, num_requests=n), seed)


def sessions_deadline_ns(plan: LevelPlan, sessions: list[Session], start_ns: int, timeout_s: float,
                         last_start_ns: int) -> int:
    """When turns still in flight are cut: the duration plus its grace, else every session's turns each taking
    the timeout (and the think time), one wave of users after another."""
    if plan.duration_s is not None:
        return start_ns + int((plan.duration_s + plan.grace(timeout_s)) * 1e9)
    users = plan.concurrency or len(sessions) or 1
    waves = math.ceil(len(sessions) / users)
    turns = max((len(s.turns) for s in sessions), default=1)
    per_session_s = turns * (timeout_s + plan.think_time_s)
    return start_ns + last_start_ns + int((waves * per_session_s + DEADLINE_SLACK_S) * 1e9)


async def _until(due_ns: int) -> None:
    delay = due_ns - time.perf_counter_ns()
    if delay > SPIN_NS:
        await asyncio.sleep((delay - SPIN_NS) / 1e9)
    while time.perf_counter_ns() < due_ns:
        await asyncio.sleep(0)


async def run_sessions(pool: Pool, target: Target, plan: LevelPlan, sessions: list[Session], start_ns: int, *,
                       repeat: int, warmup: bool, seed: int, on_done: Callable[[RequestRecord], None] | None,
                       records: list[RequestRecord]) -> tuple[int, str | None]:
    """Run a level's sessions from `start_ns`; returns (when it last decided to send, why it stopped early or
    None). Records (with `session` and `turn`) are appended as turns are decided."""
    starts = session_starts_ns(plan, len(sessions), seed)
    stop_ns = start_ns + int(plan.duration_s * 1e9) if plan.duration_s is not None else None
    cut_ns = sessions_deadline_ns(plan, sessions, start_ns, target.timeout_s, starts[-1] if starts else 0)
    cap = asyncio.Semaphore(plan.max_concurrency) if plan.max_concurrency else None
    abort: list[str] = []
    last_decided = [start_ns]

    def may_issue() -> bool:
        if abort or (plan.num_requests is not None and len(records) >= plan.num_requests):
            return False
        return stop_ns is None or time.perf_counter_ns() < stop_ns

    async def send(rec: RequestRecord, body: dict) -> None:
        if cap is None:
            await client.send(pool, target.url, client.prepare(body), rec, target.timeout_s, target.headers)
            return
        async with cap:
            await client.send(pool, target.url, client.prepare(body), rec, target.timeout_s, target.headers)

    async def run_one(s: int, first_due_ns: int | None) -> None:
        history: list[tuple[str, str]] = []
        due = first_due_ns
        for k, turn in enumerate(sessions[s].turns, 1):
            if due is not None:
                await _until(due)
            if not may_issue():
                return
            decided = due if due is not None else time.perf_counter_ns()
            rec = RequestRecord(
                index=len(records), concurrency=plan.concurrency or plan.max_concurrency,
                request_rate=plan.request_rate, repeat=repeat, warmup=warmup, decided_ns=decided,
                scheduled_ns=decided if starts is not None else None, session=s, turn=k,
                expected_input_len=turn.input_len if k == 1 else None, expected_output_len=turn.output_len,
                streamed=target.stream)
            records.append(rec)
            last_decided[0] = decided
            await send(rec, turn_body(target, history, turn))
            if on_done is not None:
                on_done(rec)
            if rec.error_class == ERR_CONNECT and not abort:
                abort.append(f"{rec.error_class}: {rec.error}")
            if not rec.ok:
                return  # no reply to go on with: the session ends here
            history.append((turn.text, rec.output_text))
            due = rec.end_ns + int(plan.think_time_s * 1e9)

    async def issue() -> None:
        if starts is not None:
            await asyncio.gather(*(run_one(s, start_ns + t) for s, t in enumerate(starts)))
            return
        counter = iter(range(len(sessions)))

        async def user() -> None:
            for s in counter:
                if not may_issue():
                    return
                await run_one(s, None)

        await asyncio.gather(*(user() for _ in range(min(plan.concurrency or 1, len(sessions)))))

    work = asyncio.ensure_future(issue())
    try:
        done, _ = await asyncio.wait({work}, timeout=max(0, cut_ns - time.perf_counter_ns()) / 1e9)
        if not done:  # the level's deadline: turns still in flight are cut, not failed
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            for rec in records:
                if not rec.ok and rec.error_class in (None, ERR_CANCELLED):
                    rec.error_class, rec.error = ERR_CUT_OFF, "cut at the level's deadline"
                    rec.end_ns = rec.end_ns or time.perf_counter_ns()
        else:
            work.result()
    except asyncio.CancelledError:
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        abort.append("interrupted")
        raise
    return last_decided[0], abort[0] if abort else None
