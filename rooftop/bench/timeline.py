"""One time axis for a bench run with server spans: `timeline.json.gz`, Chrome trace-event format (the JSON
object form, "traceEvents"), that Perfetto and chrome://tracing open and rooftop's own trace reader
(rooftop.profile.load_trace) reads back.

Every time is the client's perf_counter clock in µs (time.perf_counter_ns() / 1000, the clock of
requests.jsonl); an engine's stamps (time.time_ns()) are moved onto it by the offset measured for their level
repeat (clocks.py, as latency.join uses it). A process per level repeat; in it a thread per engine (its steps)
and a thread per request (its TTFT in parts, prefill chunks, decode, a token instant per chunk). Pure functions:
records and spans in, events out; the caller writes the file."""

from __future__ import annotations

import gzip
import json

from rooftop.bench.latency import Index, ServerView, index_spans, server_view
from rooftop.bench.otlp_receiver import SpanRec
from rooftop.bench.records import RequestRecord

SCHEMA = "rooftop.bench.timeline/1"
CAT = "user_annotation"  # the category rooftop's Kineto reader keeps as annotation ranges
STEP_TID = 1  # engine step tracks: 1, 2, ... (one per server instance)
REQUEST_TID = 1000  # request tracks: 1000 + the request's index in its level
GPU_KERNELS = ("not included: a profile is taken by `rooftop profile` in a run of its own, on the torch "
               "profiler's clock, with no stamp shared with this run's requests to put its kernels on this axis")


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


def _x(name: str, pid: int, tid: int, start_ns: int, end_ns: int, args: dict | None = None) -> dict:
    ev = {"ph": "X", "cat": CAT, "name": name, "pid": pid, "tid": tid, "ts": _us(start_ns),
          "dur": _us(max(0, end_ns - start_ns))}
    if args:
        ev["args"] = args
    return ev


def _meta(kind: str, pid: int, tid: int, name: str, sort: int | None = None) -> list[dict]:
    out = [{"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}]
    if sort is not None:
        out.append({"ph": "M", "name": kind.replace("_name", "_sort_index"), "pid": pid, "tid": tid,
                    "args": {"sort_index": sort}})
    return out


def step_events(index: Index, pid: int, offset_ns: int) -> list[dict]:
    """A track per engine of its steps, each drawn from its launch or the previous step's read-back, whichever
    is later, to its own read-back (steps overlap by the host work in between: a step is launched before the
    one before it is read back); `launched_us` keeps its launch. Its batch in args."""
    out: list[dict] = []
    for k, (instance, steps) in enumerate(sorted(index.steps.items())):
        tid = STEP_TID + k
        out += _meta("thread_name", pid, tid, f"engine steps {instance}", k)
        reach = None
        for s in sorted(steps.by_id.values(), key=lambda s: (s.start_ns, s.end_ns)):
            start = s.start_ns if reach is None else min(max(s.start_ns, reach), s.end_ns)
            reach = s.end_ns if reach is None else max(reach, s.end_ns)
            args = {key.removeprefix("rooftop.step."): v for key, v in s.attributes.items()
                    if key.startswith("rooftop.step.") and not key.endswith("_seq_ids")}
            args["launched_us"] = _us(s.start_ns - offset_ns)
            out.append(_x(f"step {args.get('kind', '')}".strip(), pid, tid, start - offset_ns, s.end_ns - offset_ns,
                          args))
    return out


def _clamp(points: list[int], lo: int, hi: int) -> list[int]:
    """Each point held within [the one before, hi], so that the parts drawn from them nest and never overlap."""
    out, prev = [], lo
    for p in points:
        prev = min(max(p, prev), hi)
        out.append(prev)
    return out


def _ttft_events(r: RequestRecord, v: ServerView, pid: int, tid: int, offset_ns: int) -> list[dict]:
    """The TTFT in the parts latency.ttft_parts measures, on the client's clock (each boundary clamped into
    the TTFT: the offset is known to its uncertainty), the prompt chunks inside `prefill`."""
    first_chunk = v.chunks[0].start_ns if v.chunks else v.first_token_ns
    engine = [v.arrival_ns, first_chunk, v.first_token_ns, v.handed_ns]
    t0, t1 = r.decided_ns, r.chunk_ns[0]
    pts = [t0] + _clamp([r.sent_ns or t0] + [ns - offset_ns for ns in engine], t0, t1) + [t1]
    names = ("client wait", "client to server", "queue", "prefill", "kv transfer", "emission")
    out = [_x(n, pid, tid, a, b) for n, a, b in zip(names, pts, pts[1:], strict=False) if b > a or n == "prefill"]
    lo, hi, reach = pts[3], pts[4], None
    for c in v.chunks:
        start = c.start_ns - offset_ns if reach is None else max(c.start_ns - offset_ns, reach)
        a, b = _clamp([start, c.end_ns - offset_ns], lo, hi)
        reach = b
        out.append(_x("prefill chunk", pid, tid, a, b, {
            "step_id": c.attributes.get("rooftop.step.id"), "tokens": c.attributes.get("rooftop.chunk.tokens"),
            "cached_tokens": c.attributes.get("rooftop.chunk.cached_tokens"),
            "launched_us": _us(c.start_ns - offset_ns), "read_back_us": _us(c.end_ns - offset_ns)}))
    return out


def request_events(r: RequestRecord, v: ServerView | None, pid: int, tid: int, offset_ns: int) -> list[dict]:
    """One request's track: `request` (decided → its last chunk, or its end), `ttft` in parts where it has
    server spans, `decode` (first chunk → last), a `token` instant per chunk (an ITL outlier's cause on it)."""
    end = max(r.end_ns or 0, r.chunk_ns[-1])
    out = _meta("thread_name", pid, tid, f"request {r.request_id or r.index}", REQUEST_TID + r.index)
    out.append(_x("request", pid, tid, r.decided_ns, end, {"request_id": r.request_id, "index": r.index,
                                                           "ttft_breakdown": r.ttft_breakdown}))
    out.append(_x("ttft", pid, tid, r.decided_ns, r.chunk_ns[0]))
    if v is not None:
        out += _ttft_events(r, v, pid, tid, offset_ns)
    if len(r.chunk_ns) > 1:
        out.append(_x("decode", pid, tid, r.chunk_ns[0], r.chunk_ns[-1], {"chunks": len(r.chunk_ns)}))
    causes = {o["index"]: o for o in r.itl_outliers or []}
    for j, ns in enumerate(r.chunk_ns):
        args = {"index": j, "tokens": r.chunk_tokens[j] if j < len(r.chunk_tokens) else None}
        if j in causes:
            args["itl_outlier"] = causes[j]
        out.append({"ph": "i", "s": "t", "cat": CAT, "name": "token", "pid": pid, "tid": tid, "ts": _us(ns),
                    "args": args})
    for ns in v.preempted_ns if v is not None else []:
        out.append({"ph": "i", "s": "t", "cat": CAT, "name": "preempted", "pid": pid, "tid": tid,
                    "ts": _us(min(max(ns - offset_ns, r.decided_ns), end))})
    return out


def level_events(records: list[RequestRecord], spans: list[SpanRec], offset_ns: int, pid: int,
                 label: str) -> list[dict]:
    """A level repeat's process: its engines' steps and every finished request of it, on the client's clock
    (engine ns − offset_ns = client ns)."""
    index = index_spans(spans)
    out = _meta("process_name", pid, 0, label, pid)
    out += step_events(index, pid, offset_ns)
    for r in records:
        if r.warmup or not r.ok or not r.chunk_ns:
            continue
        found = index.requests.get(r.request_id or "")
        v = server_view(found, index.children) if found else None
        out += request_events(r, v, pid, REQUEST_TID + r.index, offset_ns)
    return out


def document(events: list[dict], clocks: list[dict]) -> dict:
    """The file's JSON object: the events, and in otherData what clock they are on and what is left out."""
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schema": SCHEMA, "clock": "the client's time.perf_counter_ns() / 1000 (µs), as "
                          "requests.jsonl's stamps; engine stamps moved by each level repeat's measured offset",
                          "offsets": clocks, "gpu_kernels": GPU_KERNELS}}


def encode(doc: dict) -> bytes:
    """The gzip'd JSON of a document (mtime 0: the same events give the same bytes)."""
    return gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), mtime=0)
