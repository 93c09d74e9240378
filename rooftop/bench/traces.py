"""Request traces replayed on their own clock: the published formats read into one list of requests, and the
schedule a level replays (pure functions; `read_trace` is the one that opens the file).

Formats (`--dataset NAME --dataset-path FILE`):

- mooncake: JSON Lines, {"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}, one hash id
  per BLOCK_TOKENS-token block of the prompt (Mooncake's `conversation_trace.jsonl` and its siblings);
- burstgpt: BurstGPT's CSV, `Timestamp` (s), `Model`, `Request tokens`, `Response tokens`, `Total tokens`,
  `Log Type`; rows whose response has no tokens (the service's failures) are left out and counted;
- azure: the Azure LLM inference trace's CSV, `TIMESTAMP` (a date and time), `ContextTokens`,
  `GeneratedTokens`; rows with no generated tokens are left out and counted;
- trace: rooftop's own JSON Lines, {"timestamp_ms", "input_len", "output_len", optional "hash_ids" (as
  Mooncake's) or "prompt" (text sent as is; then input_len may be left out)}.

Trace time is seconds since the file's first request. A bad line is one error naming the file, the line and
the field, before anything is sent.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
from dataclasses import dataclass
from pathlib import Path

from rooftop.errors import RooftopError

BLOCK_TOKENS = 512  # tokens a Mooncake hash id stands for (and rooftop's own trace's)
FORMATS = ("mooncake", "burstgpt", "azure", "trace")

_FIX = {
    "mooncake": 'one JSON object a line: {"timestamp": MS, "input_length": N, "output_length": N, "hash_ids": [...]}',
    "burstgpt": "BurstGPT's CSV: a header Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
    "azure": "the Azure trace's CSV: a header TIMESTAMP,ContextTokens,GeneratedTokens",
    "trace": 'one JSON object a line: {"timestamp_ms": MS, "input_len": N, "output_len": N} (optional "hash_ids" '
             'or "prompt")',
}


@dataclass(slots=True, frozen=True)
class TraceRequest:
    """One request of a trace: when it came (ms of trace time), its lengths in tokens, and what it shares."""

    line: int  # 1-based line of the file it came from
    at_ms: float  # since the trace's first request
    input_len: int | None  # None: a rooftop trace's `prompt`, counted by the tokenizer
    output_len: int
    hash_ids: tuple[int, ...] | None = None  # one per BLOCK_TOKENS-token block, from the prompt's start
    prompt: str | None = None


@dataclass(slots=True)
class Trace:
    """A parsed trace: its requests in time order, and the rows it left out (by reason)."""

    path: str
    fmt: str
    requests: list[TraceRequest]
    skipped: dict[str, int]


class _Bad(Exception):
    """One bad field of one line: the reader turns it into the file's error."""

    def __init__(self, field: str | None, why: str):
        super().__init__(why)
        self.field, self.why = field, why


def _number(row: dict, key: str):
    """The field as it came, a string (a CSV cell) read as a float; _Bad when it is missing or not a number."""
    v = row.get(key)
    if v is None or v == "":
        raise _Bad(key, "is missing")
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise _Bad(key, f"is {v!r}, not a number") from None
    return v


def _count(row: dict, key: str, least: int) -> int:
    v = _number(row, key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v != int(v):
        raise _Bad(key, f"is {v!r}, not a whole number of tokens")
    if v < least:
        raise _Bad(key, f"is {int(v)}: at least {least} token{'s' if least != 1 else ''}")
    return int(v)


def _time(row: dict, key: str) -> float:
    v = _number(row, key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _Bad(key, f"is {v!r}, not a number")
    if v < 0:
        raise _Bad(key, f"is {v:g}: a timestamp is 0 or more")
    return float(v)


def _hash_ids(row: dict, key: str, input_len: int | None, required: bool) -> tuple[int, ...] | None:
    v = row.get(key)
    if v is None:
        if required:
            raise _Bad(key, "is missing")
        return None
    if not isinstance(v, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in v):
        raise _Bad(key, "is not a list of integers")
    if input_len is not None and len(v) > math.ceil(input_len / BLOCK_TOKENS):
        raise _Bad(key, f"names {len(v)} blocks of {BLOCK_TOKENS} tokens for a prompt of {input_len} tokens "
                        f"(at most {math.ceil(input_len / BLOCK_TOKENS)})")
    return tuple(v)


def _json_object(text: str) -> dict:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Bad(None, f"is not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise _Bad(None, f"is a JSON {type(row).__name__}, not an object")
    return row


def _mooncake(text: str, line: int) -> TraceRequest:
    row = _json_object(text)
    at = _time(row, "timestamp")
    n_in = _count(row, "input_length", 1)
    return TraceRequest(line, at, n_in, _count(row, "output_length", 1), _hash_ids(row, "hash_ids", n_in, True))


def _rooftop(text: str, line: int) -> TraceRequest:
    row = _json_object(text)
    at = _time(row, "timestamp_ms")
    prompt = row.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise _Bad("prompt", f"is a {type(prompt).__name__}, not text")
    if prompt is not None and "hash_ids" in row:
        raise _Bad("hash_ids", "and \"prompt\" were both given: a prompt is sent as is, hash ids build one")
    n_in = _count(row, "input_len", 1) if prompt is None or "input_len" in row else None
    return TraceRequest(line, at, n_in, _count(row, "output_len", 1), _hash_ids(row, "hash_ids", n_in, False),
                        prompt)


def _json_lines(text: str, parse) -> list[TraceRequest]:
    out = []
    for i, raw in enumerate(text.splitlines(), 1):
        if raw.strip():
            try:
                out.append(parse(raw, i))
            except _Bad as bad:
                bad.line = i
                raise
    return out


def _csv_rows(text: str, columns: tuple[str, ...]):
    """(line, row) of a CSV with a header naming at least `columns`."""
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        bad = _Bad(missing[0], f"is not a column of the header (it has {', '.join(reader.fieldnames or []) or 'none'})")
        bad.line = 1
        raise bad
    for row in reader:
        yield reader.line_num, row


def _burstgpt(text: str, skipped: dict[str, int]) -> list[TraceRequest]:
    out = []
    for line, row in _csv_rows(text, ("Timestamp", "Request tokens", "Response tokens")):
        try:
            at_s = _time(row, "Timestamp")
            n_in, n_out = _count(row, "Request tokens", 0), _count(row, "Response tokens", 0)
        except _Bad as bad:
            bad.line = line
            raise
        if n_out == 0 or n_in == 0:
            key = "no_response_tokens" if n_out == 0 else "no_request_tokens"
            skipped[key] = skipped.get(key, 0) + 1
            continue
        out.append(TraceRequest(line, at_s * 1000.0, n_in, n_out))
    return out


def _azure(text: str, skipped: dict[str, int]) -> list[TraceRequest]:
    out, first = [], None
    for line, row in _csv_rows(text, ("TIMESTAMP", "ContextTokens", "GeneratedTokens")):
        try:
            stamp = (row.get("TIMESTAMP") or "").strip()
            if not stamp:
                raise _Bad("TIMESTAMP", "is missing")
            try:
                when = dt.datetime.fromisoformat(stamp)
            except ValueError:
                raise _Bad("TIMESTAMP", f"is {stamp!r}, not a date and time (e.g. 2023-11-16 18:15:46.6805900)") from None
            n_in, n_out = _count(row, "ContextTokens", 0), _count(row, "GeneratedTokens", 0)
        except _Bad as bad:
            bad.line = line
            raise
        first = first or when
        if n_out == 0 or n_in == 0:
            key = "no_generated_tokens" if n_out == 0 else "no_context_tokens"
            skipped[key] = skipped.get(key, 0) + 1
            continue
        out.append(TraceRequest(line, (when - first).total_seconds() * 1000.0, n_in, n_out))
    return out


def parse_trace(text: str, fmt: str, path: str = "<trace>") -> Trace:
    """A trace file's text in its format, its requests in time order with trace time from the first one."""
    skipped: dict[str, int] = {}
    try:
        if fmt == "mooncake":
            reqs = _json_lines(text, _mooncake)
        elif fmt == "trace":
            reqs = _json_lines(text, _rooftop)
        elif fmt == "burstgpt":
            reqs = _burstgpt(text, skipped)
        elif fmt == "azure":
            reqs = _azure(text, skipped)
        else:
            raise ValueError(f"unknown trace format {fmt!r}")
    except _Bad as bad:
        where = f"{path}, line {bad.line}" + (f", field {bad.field!r}" if bad.field else "")
        raise RooftopError(f"{where} {bad.why}: the trace is not replayed (nothing was sent)",
                           f"fix that line; --dataset {fmt} reads {_FIX[fmt]}") from None
    if not reqs:
        raise RooftopError(f"{path} holds no requests", f"--dataset {fmt} reads {_FIX[fmt]}")
    reqs.sort(key=lambda r: r.at_ms)  # stable: equal times keep the file's order
    t0 = reqs[0].at_ms
    reqs = [TraceRequest(r.line, r.at_ms - t0, r.input_len, r.output_len, r.hash_ids, r.prompt) for r in reqs]
    return Trace(path, fmt, reqs, skipped)


def read_trace(path: str | Path, fmt: str) -> Trace:
    """Read and parse a trace file (the one function here that does I/O)."""
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise RooftopError(f"cannot read trace {p} ({exc})", f"point --dataset-path at {_FIX[fmt]}") from exc
    return parse_trace(text, fmt, str(p))


@dataclass(slots=True)
class Replay:
    """What a level replays of a trace: its requests, each one's send time (ns from the level's start), the
    mean rate of that schedule, and what was cut (a sentence, or None)."""

    requests: list[TraceRequest]
    offsets_ns: list[int]
    mean_rate: float  # requests/s: n - 1 gaps over the schedule's span (0 for one request)
    cut: str | None


def replay(trace: Trace, *, speedup: float = 1.0, window_s: tuple[float, float] | None = None,
           num_requests: int | None = None, duration_s: float | None = None) -> Replay:
    """The requests of `window_s` (seconds of trace time, [start, end)), sent at their trace times relative to
    the first of them, divided by `speedup`; cut to the level's budget (`num_requests`, `duration_s` of replay
    time), with a sentence saying so."""
    reqs = trace.requests
    if window_s is not None:
        lo, hi = window_s[0] * 1000.0, window_s[1] * 1000.0
        reqs = [r for r in reqs if lo <= r.at_ms < hi]
        if not reqs:
            raise RooftopError(f"{trace.path} has no request in the window {window_s[0]:g}:{window_s[1]:g} s of "
                               f"trace time (it spans {trace.requests[-1].at_ms / 1000:.3f} s)",
                               "widen --trace-window")
    t0 = reqs[0].at_ms
    offsets = [round((r.at_ms - t0) / speedup * 1e6) for r in reqs]
    whole_n, whole_s = len(reqs), offsets[-1] / 1e9
    cuts = []
    if duration_s is not None:
        keep = sum(t < duration_s * 1e9 for t in offsets)
        if keep < len(reqs):
            cuts.append(f"--duration {duration_s:g}")
            reqs, offsets = reqs[:keep], offsets[:keep]
    if num_requests is not None and num_requests < len(reqs):
        cuts.append(f"--num-requests {num_requests}")
        reqs, offsets = reqs[:num_requests], offsets[:num_requests]
    span_s = offsets[-1] / 1e9
    cut = None
    if cuts:
        cut = (f"trace cut to its first {len(reqs)} of {whole_n} requests{' in the window' if window_s else ''} by "
               f"{' and '.join(cuts)}: {span_s:.1f} s of its {whole_s:.1f} s replayed")
    return Replay(reqs, offsets, (len(offsets) - 1) / span_s if span_s > 0 else 0.0, cut)


def expected_reuse(rep: Replay) -> float | None:
    """The share of prompt tokens a prefix cache large enough could serve: tokens of each prompt's leading
    run of blocks seen before (by an earlier request of the replay), over all prompt tokens; None when the
    trace names no blocks. (Mooncake's ids are chained, so a block seen before has its whole prefix seen.)
    A block seen before only as a prompt's short last block counts the tokens seen, not the whole block:
    a cache holds what was computed, and no more of the block than that was."""
    if not any(r.hash_ids for r in rep.requests):
        return None
    seen: dict[int, int] = {}  # block id -> the most of its tokens a request so far has held
    reused = total = 0
    for r in rep.requests:
        n = r.input_len or 0
        total += n
        leading = True
        for j, h in enumerate(r.hash_ids or ()):
            here = min(BLOCK_TOKENS, n - j * BLOCK_TOKENS)
            leading = leading and h in seen
            if leading:
                reused += min(here, seen[h])
                leading = seen[h] >= here  # past a shorter block seen before, nothing more is held
            seen[h] = max(seen.get(h, 0), here)
    return round(reused / total, 6) if total else None
