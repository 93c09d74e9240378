"""Why a request's latency is what it is: the server's request and step spans (bench/otlp_receiver.py) joined
to the client's records by request id; each TTFT split into parts measured from their own stamps, and each ITL
outlier attributed to what the engine did in that gap. Pure functions: spans and records in, dicts out.

Span names and attributes are the embedded engine's (rooftop/engine/README.md, "Request spans"); engine times
are its time.time_ns(), moved onto the client's perf_counter_ns by a measured offset (clocks.py). vLLM's spans
(one `llm_request` a request, named `cmpl-<X-Request-Id>-<prompt index>` or `chatcmpl-<X-Request-Id>`, no
events, no steps) give queue, prefill and decode from its `gen_ai.latency.*` attributes (`vllm_parts`)."""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from rooftop.bench.clocks import ClockOffset, bounds_from_requests, choose
from rooftop.bench.otlp_receiver import SpanRec, client_request_id
from rooftop.bench.records import RequestRecord

NS_PER_MS = 1_000_000
OUTLIER_FACTOR = 2.0  # an ITL outlier: a gap over this many times its level's median ITL
# the parts of a TTFT, in the order a request meets them (docs/bench-output.md defines each)
PARTS = ("client_wait", "client_to_server", "queue", "prefill", "prefill_wait", "kv_transfer", "emission")
CAUSES = ("preemption", "prefill_chunk", "batch_grew", "host_stall", "delivery", "unexplained", "no_steps",
          "tokens_unknown")
FLAG = "--otlp-traces-endpoint http://HOST:PORT/v1/traces"
NO_SPANS = f"no server spans: start the engine with {FLAG} (HOST:PORT as --otlp-receiver)"
PERCENTILES = (50, 90, 99)


@dataclass(slots=True)
class Steps:
    """One server's engine_step spans: by id, and their ends in order (to find the steps that ended in a gap)."""

    by_id: dict[int, SpanRec] = field(default_factory=dict)
    ends: list[int] = field(default_factory=list)  # sorted end ns
    ids_by_end: list[int] = field(default_factory=list)

    def ran_in(self, after_ns: int, until_ns: int) -> list[SpanRec]:
        """Steps that ran at some time in (after_ns, until_ns): those read back in it, and one launched in it
        and read back later (launched before the step it follows is read back, it holds that read-back up)."""
        lo, hi = bisect.bisect_right(self.ends, after_ns), bisect.bisect_right(self.ends, until_ns)
        return [s for i in self.ids_by_end[lo:hi + 4] if (s := self.by_id[i]).start_ns < until_ns]

    def running_ns(self, start_ns: int, end_ns: int) -> int:
        """Time in [start_ns, end_ns] during which some step ran (the union of their intervals)."""
        covered, reach = 0, start_ns
        # those that ended in the window, and the few still running at its end (steps overlap by one or two)
        lo, hi = bisect.bisect_left(self.ends, start_ns), bisect.bisect_right(self.ends, end_ns) + 4
        spans = sorted((self.by_id[i].start_ns, self.by_id[i].end_ns) for i in self.ids_by_end[lo:hi])
        for s, e in spans:
            if s >= end_ns:
                break
            s, e = max(s, reach), min(e, end_ns)
            if e > s:
                covered += e - s
                reach = e
        return covered


@dataclass(slots=True)
class Index:
    """The spans of a level, arranged for the join."""

    requests: dict[str, list[SpanRec]]  # by gen_ai.request.id: one span, or (PD) one per worker
    children: dict[bytes, list[SpanRec]]  # by parent span id
    steps: dict[str, Steps]  # by server instance


def index_spans(spans: list[SpanRec]) -> Index:
    requests: dict[str, list[SpanRec]] = defaultdict(list)
    children: dict[bytes, list[SpanRec]] = defaultdict(list)
    steps: dict[str, Steps] = defaultdict(Steps)
    for s in spans:
        if s.name == "llm_request":
            requests[client_request_id(str(s.attributes.get("gen_ai.request.id")))].append(s)
        elif s.name == "engine_step":
            steps[s.instance].by_id[int(s.attributes.get("rooftop.step.id", -1))] = s
        elif s.parent_span_id:
            children[s.parent_span_id].append(s)
    for st in steps.values():
        order = sorted(st.by_id.items(), key=lambda kv: kv[1].end_ns)
        st.ids_by_end = [i for i, _ in order]
        st.ends = [s.end_ns for _, s in order]
    return Index(dict(requests), dict(children), dict(steps))


def _event(span: SpanRec, name: str) -> int:
    return next((ns for n, ns, _ in span.events if n == name), 0)


@dataclass(slots=True)
class ServerView:
    """A request's engine stamps (time.time_ns()) in the order it met them; PD: prefill and decode workers'."""

    arrival_ns: int
    chunks: list[SpanRec]  # its prompt chunks up to its first token, by start
    first_token_ns: int  # the step that sampled it was read back (PD: on the prefill worker)
    handed_ns: int  # PD: the decode worker had the first token; else first_token_ns
    written_ns: int  # its SSE chunk was written
    decoder: SpanRec  # the span whose steps made the later tokens
    preempted_ns: list[int]


def server_view(spans: list[SpanRec], children: dict[bytes, list[SpanRec]]) -> ServerView | None:
    """The stamps of one request's span(s); None when they lack what the TTFT needs."""
    kids = {s.span_id: children.get(s.span_id, []) for s in spans}
    prefill = next((s for s in spans if any(k.name == "kv_sent" for k in kids[s.span_id])), None)
    decode = next((s for s in spans if any(k.name == "kv_received" for k in kids[s.span_id])), None)
    first = prefill if prefill is not None and decode is not None else spans[0]
    last = decode if prefill is not None and decode is not None else spans[0]
    chunks_all = sorted((k for k in kids[first.span_id] if k.name == "prefill_chunk"), key=lambda k: k.start_ns)
    first_token_ns = _event(first, "first_token") or (chunks_all[-1].end_ns if chunks_all else 0)
    handed_ns = first_token_ns if last is first else (_event(last, "first_token") or
                                                      _event(last, "first_token_received"))
    if not (first.start_ns and first_token_ns and handed_ns):
        return None
    chunks = [c for c in chunks_all if c.end_ns <= first_token_ns]
    return ServerView(_event(first, "arrival") or first.start_ns, chunks, first_token_ns, handed_ns,
                      _event(last, "first_token_written"), last,
                      sorted(ns for s in spans for n, ns, _ in s.events if n == "preempted"))


def ttft_parts(rec: RequestRecord, v: ServerView, offset_ns: int) -> dict:
    """The record's TTFT in parts (ms), each the difference of two stamps of its own; `residual_ms` is the
    TTFT less their sum (the clock offset's error, and any overlap of its own chunks)."""
    arrival, first_token, handed = (v.arrival_ns - offset_ns, v.first_token_ns - offset_ns, v.handed_ns - offset_ns)
    first_chunk = v.chunks[0].start_ns - offset_ns if v.chunks else first_token
    own, waited, reach = 0, 0, v.chunks[0].start_ns if v.chunks else 0
    for c in v.chunks:  # a chunk's step may be launched before the one before it is read back: overlaps once
        waited += max(0, c.start_ns - reach)
        own += max(0, c.end_ns - max(c.start_ns, reach))
        reach = max(reach, c.end_ns)
    if v.chunks:
        waited += max(0, v.first_token_ns - reach)
    ns = {"client_wait": rec.sent_ns - rec.decided_ns, "client_to_server": arrival - rec.sent_ns,
          "queue": first_chunk - arrival, "prefill": own, "prefill_wait": waited, "kv_transfer": handed - first_token,
          "emission": rec.chunk_ns[0] - handed}
    ttft = rec.chunk_ns[0] - rec.decided_ns
    out = {"ttft_ms": round(ttft / NS_PER_MS, 4)}
    out.update({f"{p}_ms": round(ns[p] / NS_PER_MS, 4) for p in PARTS})
    out["residual_ms"] = round((ttft - sum(ns.values())) / NS_PER_MS, 4)
    out["prefill_chunks"] = len(v.chunks)
    out["first_token_written_ms"] = round((v.written_ns - v.handed_ns) / NS_PER_MS, 4) if v.written_ns else None
    return out


VLLM_LATENCY = "gen_ai.latency.time_to_first_token"


def vllm_parts(rec: RequestRecord, span: SpanRec, offset_ns: int) -> dict:
    """The record's TTFT in parts from a vLLM span (ms): the client's stamps, the span's start (vLLM's arrival)
    and its gen_ai.latency.* durations. vLLM's prefill runs from the request's first schedule to its first token,
    so time its chunks waited behind other work is inside it (prefill_wait 0); `server_other_ms` is vLLM's own
    TTFT less its queue and prefill (handling before the queue), and `decode_ms` its decode time."""
    a = span.attributes
    sec = {k: int(float(a.get(f"gen_ai.latency.{k}", 0.0)) * 1e9)
           for k in ("time_in_queue", "time_in_model_prefill", "time_in_model_decode", "time_to_first_token")}
    arrival = span.start_ns - offset_ns
    ns = {"client_wait": rec.sent_ns - rec.decided_ns, "client_to_server": arrival - rec.sent_ns,
          "queue": sec["time_in_queue"], "prefill": sec["time_in_model_prefill"], "prefill_wait": 0, "kv_transfer": 0,
          "emission": rec.chunk_ns[0] - (arrival + sec["time_to_first_token"])}
    other = sec["time_to_first_token"] - sec["time_in_queue"] - sec["time_in_model_prefill"]
    ttft = rec.chunk_ns[0] - rec.decided_ns
    out = {"ttft_ms": round(ttft / NS_PER_MS, 4)}
    out.update({f"{p}_ms": round(ns[p] / NS_PER_MS, 4) for p in PARTS})
    out["server_other_ms"] = round(other / NS_PER_MS, 4)
    out["residual_ms"] = round((ttft - sum(ns.values()) - other) / NS_PER_MS, 4)
    out["decode_ms"] = round(sec["time_in_model_decode"] / NS_PER_MS, 4)
    out["prefill_chunks"] = None
    out["first_token_written_ms"] = None
    out["source"] = "vllm gen_ai.latency.*"
    return out


def decode_step_ids(span: SpanRec, children: dict[bytes, list[SpanRec]]) -> list[int]:
    """The ids of the decode steps that made a request's tokens after its first, in order."""
    runs = sorted((int(k.attributes["rooftop.decode.first_step_id"]), int(k.attributes["rooftop.decode.last_step_id"]))
                  for k in children.get(span.span_id, []) if k.name == "decode")
    return [i for first, last in runs for i in range(first, last + 1)]


def itl_outliers(rec: RequestRecord, v: ServerView, children: dict[bytes, list[SpanRec]], steps: Steps | None,
                 median_ns: float, offset_ns: int) -> list[dict]:
    """Each gap of the record over OUTLIER_FACTOR x the level's median ITL, with what the engine did in it: the
    window from the step that made the gap's earlier token to the one that made its later token."""
    out = []
    if not rec.streamed or len(rec.chunk_ns) < 2 or not median_ns:
        return out
    ids = decode_step_ids(v.decoder, children)
    last_chunk = v.chunks[-1] if v.chunks else None
    first_step = int(last_chunk.attributes.get("rooftop.step.id", -1)) if last_chunk else -1
    token_end = np.cumsum(rec.chunk_tokens) - 1  # the index of each chunk's last token
    # A chunk's tokens are known when the server counted them (usage in every chunk, token ids); counted as one a
    # chunk, several-token chunks (speculative decoding) fall short of the usage: no gap can be set on its steps.
    known = int(token_end[-1]) + 1 == rec.output_tokens
    for j in range(1, len(rec.chunk_ns)):
        gap = rec.chunk_ns[j] - rec.chunk_ns[j - 1]
        if gap <= OUTLIER_FACTOR * median_ns:
            continue
        entry = {"index": j, "gap_ms": round(gap / NS_PER_MS, 4)}
        if not known:
            out.append(entry | {"cause": "tokens_unknown"})
            continue
        a, b = int(token_end[j - 1]), int(token_end[j])
        step_a = first_step if a == 0 else ids[a - 1] if a - 1 < len(ids) else None
        step_b = ids[b - 1] if 0 < b <= len(ids) else None
        if steps is None or step_a not in steps.by_id or step_b not in steps.by_id:
            out.append(entry | {"cause": "no_steps"})
            continue
        entry.update(attribute_gap(steps, steps.by_id[step_a], steps.by_id[step_b], v.preempted_ns, median_ns))
        out.append(entry)
    return out


def attribute_gap(steps: Steps, before: SpanRec, after: SpanRec, preempted_ns: list[int], median_ns: float) -> dict:
    """What the engine did between two steps' read-backs, first cause first: a preemption of this request, a
    prompt chunk in a step that ran in the gap, a step that grew the batch, no step running (a host stall),
    or nothing of note (the engine was on time: the delay came on the way to the client)."""
    t0, t1 = before.end_ns, after.end_ns
    engine_gap = t1 - t0
    out: dict = {"engine_gap_ms": round(engine_gap / NS_PER_MS, 4)}
    step_a, step_b = int(before.attributes["rooftop.step.id"]), int(after.attributes["rooftop.step.id"])
    if any(t0 < ns <= t1 for ns in preempted_ns) or step_b - step_a > 1:
        return out | {"cause": "preemption"}
    ran = steps.ran_in(t0, t1)
    prefill_tokens = sum(int(s.attributes.get("rooftop.step.prefill_tokens", 0)) for s in ran)
    if prefill_tokens:
        return out | {"cause": "prefill_chunk", "prefill_tokens": prefill_tokens}
    prev = steps.by_id.get(step_b - 1)
    seqs_b = int(after.attributes.get("rooftop.step.num_seqs", 0))
    seqs_prev = int(prev.attributes.get("rooftop.step.num_seqs", 0)) if prev is not None else seqs_b
    if seqs_b > seqs_prev:
        return out | {"cause": "batch_grew", "seqs_from": seqs_prev, "seqs_to": seqs_b}
    idle = engine_gap - steps.running_ns(t0, t1)
    if idle > 0 and idle >= (engine_gap - median_ns) / 2:
        return out | {"cause": "host_stall", "idle_ms": round(idle / NS_PER_MS, 4)}
    if engine_gap <= OUTLIER_FACTOR * median_ns:
        return out | {"cause": "delivery"}
    return out | {"cause": "unexplained"}


def median_itl_ns(records: list[RequestRecord]) -> float:
    gaps = [b - a for r in records if r.ok and r.streamed for a, b in zip(r.chunk_ns, r.chunk_ns[1:], strict=False)]
    return float(np.median(gaps)) if gaps else 0.0


def join(records: list[RequestRecord], spans: list[SpanRec], local: ClockOffset) -> dict:
    """Annotate each finished record that has server spans (ttft_breakdown, itl_outliers) in place; returns the
    level run's join: how many were joined, the clock offset used, the ITL outlier threshold."""
    ok = [r for r in records if r.ok and r.chunk_ns and r.sent_ns is not None]
    base = {"requests": len(ok), "joined": 0, "spans": len(spans), "clock": None, "itl_threshold_ms": None}
    if not spans:
        return base | {"note": NO_SPANS}
    idx = index_spans(spans)
    views, vllm = {}, {}
    for r in ok:
        found = idx.requests.get(r.request_id or "")
        v = server_view(found, idx.children) if found else None
        if v is not None:
            views[r.request_id] = (r, v)
        elif found and VLLM_LATENCY in found[0].attributes:
            vllm[r.request_id] = (r, found[0])
    # the token's read-back, not its write: a write is stamped when the call returns, which on loopback can be
    # after the client's kernel had the bytes
    pairs = [(r.sent_ns, v.arrival_ns, v.handed_ns, r.chunk_ns[0]) for r, v in views.values()]
    pairs += [(r.sent_ns, s.start_ns, s.start_ns + int(float(s.attributes[VLLM_LATENCY]) * 1e9), r.chunk_ns[0])
              for r, s in vllm.values()]
    clock = choose(local, bounds_from_requests(pairs))
    median = median_itl_ns(ok)
    for r, v in views.values():
        r.ttft_breakdown = ttft_parts(r, v, clock.offset_ns)
        r.itl_outliers = itl_outliers(r, v, idx.children, idx.steps.get(v.decoder.instance), median, clock.offset_ns)
    for r, s in vllm.values():
        r.ttft_breakdown = vllm_parts(r, s, clock.offset_ns)
        r.itl_outliers = []
    joined = len(views) + len(vllm)
    note = None if joined else (f"server spans came ({len(spans)}) but none named this level's requests "
                                "(the engine must take the client's X-Request-Id)")
    if vllm:
        note = "vLLM's spans carry no engine steps: its ITL outliers are not attributed"
    return base | {"joined": joined, "clock": clock.to_json(),
                   "itl_threshold_ms": round(OUTLIER_FACTOR * median / NS_PER_MS, 4), "note": note}


def _nearest_rank(sorted_recs: list[RequestRecord], p: float) -> RequestRecord:
    return sorted_recs[max(0, math.ceil(p / 100 * len(sorted_recs)) - 1)]


def level_breakdown(records: list[RequestRecord], joins: list[dict | None]) -> dict | None:
    """A level's server-side view across its repeats (None when no receiver ran): the joined share, the TTFT
    parts of the requests at p50/p90/p99 of TTFT and each part's share of all TTFT, the ITL outliers' causes."""
    joins = [j for j in joins if j is not None]
    if not joins:
        return None
    requests, joined = sum(j["requests"] for j in joins), sum(j["joined"] for j in joins)
    notes = sorted({j["note"] for j in joins if j.get("note")})
    out = {"requests": requests, "joined": joined, "joined_share": round(joined / requests, 4) if requests else None,
           "note": "; ".join(notes) or None, "clock": [j["clock"] for j in joins],
           "itl_threshold_ms": [j["itl_threshold_ms"] for j in joins], "ttft_breakdown": None, "itl_outliers": None}
    with_parts = sorted((r for r in records if r.ttft_breakdown), key=lambda r: r.ttft_breakdown["ttft_ms"])
    if not with_parts:
        return out
    total_ttft = sum(r.ttft_breakdown["ttft_ms"] for r in with_parts)
    breakdown = {f"p{p}": {"request_id": (rec := _nearest_rank(with_parts, p)).request_id, **rec.ttft_breakdown}
                 for p in PERCENTILES}
    breakdown["mean_share"] = {p: round(sum(r.ttft_breakdown[f"{p}_ms"] for r in with_parts) / total_ttft, 4)
                               if total_ttft else None for p in PARTS}
    breakdown["max_abs_residual_ms"] = max(abs(r.ttft_breakdown["residual_ms"]) for r in with_parts)
    out["ttft_breakdown"] = breakdown
    outliers = [o for r in with_parts for o in r.itl_outliers or []]
    causes = {c: n for c in CAUSES if (n := sum(o["cause"] == c for o in outliers))}
    chunk_tokens = [o["prefill_tokens"] for o in outliers if o["cause"] == "prefill_chunk"]
    out["itl_outliers"] = {"count": len(outliers), "causes": causes,
                           "prefill_tokens_median": float(np.median(chunk_tokens)) if chunk_tokens else None}
    return out


def breakdown_line(label: str, spans: dict) -> str:
    """One line for the table's notes: the p99 request's TTFT by part, and the ITL outliers' causes."""
    if spans.get("ttft_breakdown") is None:
        return f"{label}: {spans.get('note') or NO_SPANS}."
    p99 = spans["ttft_breakdown"]["p99"]
    parts = sorted(((p99[f"{p}_ms"], p) for p in PARTS if p99[f"{p}_ms"] > 0), reverse=True)
    ttft = p99["ttft_ms"] or 1.0
    text = ", ".join(f"{p.replace('_', ' ')} {100 * ms / ttft:.0f}%" for ms, p in parts[:4])
    share = "" if spans["joined"] == spans["requests"] else f" ({spans['joined']}/{spans['requests']} joined)"
    o = spans["itl_outliers"]
    causes = ", ".join(f"{c.replace('_', ' ')} {n}" for c, n in o["causes"].items()) if o["count"] else "none"
    return f"{label}: p99 TTFT {ttft:.1f} ms = {text}{share}; ITL outliers {o['count']}: {causes}."
