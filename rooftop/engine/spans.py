"""A request's stamps and the engine's step records -> OpenTelemetry spans (OTLP protobuf), joined by seq id.

The step loop only appends what each step held (`StepRecord.batch`, `.preempted`, `.queued`: see engine.py);
the front end stamps what it sees of a request (`RequestTrace`). `SpanBuilder`, on the exporter's thread,
keeps each sequence's steps until its request's stamps come, then makes its spans: one `llm_request` (as
vLLM names it) with events and child spans, and one `engine_step` per step. The README's "Request spans"
section lists the names; every time is time.time_ns() (unix-epoch ns, as OTLP wants), one clock per host.
"""

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from opentelemetry.proto.trace.v1.trace_pb2 import Span

from rooftop.engine.engine import StepRecord

# a request whose stamps came waits at most this long for step records still on their way (the step that
# read its last token back is in; one launched before that may carry it once more, its pick dropped)
SETTLE_S = 0.5
# a sequence no step has named for this many steps, and no request claimed, is forgotten (one the front end
# never reported, e.g. a PD hand-over nobody streamed)
FORGET_AFTER_STEPS = 1 << 16
REMEMBER_FINISHED = 4096  # seq ids whose spans are made: a late step record of theirs is ignored

SERVER, INTERNAL, CLIENT = Span.SpanKind.SPAN_KIND_SERVER, Span.SpanKind.SPAN_KIND_INTERNAL, Span.SpanKind.SPAN_KIND_CLIENT


@dataclass(slots=True)
class RequestTrace:
    """What the server saw of one request, in time.time_ns(); `close()` hands it to the tracer."""

    request_id: str  # the client's X-Request-Id, else the reply's id
    arrival_ns: int  # the server got the request (before its body was parsed)
    trace_id: bytes  # the client's traceparent's, else random
    parent_span_id: bytes = b""
    seq_id: int = -1  # the engine's id, joining it to the steps' batches
    model: str = ""
    max_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0
    first_token_ns: int = 0  # its first token reached the server's event loop
    first_token_written_ns: int = 0  # ... and was written to the client (a whole JSON reply: when written)
    finish_ns: int = 0  # its last event reached the server's event loop
    finish_reason: str = ""
    kv: tuple[str, int, int, int] | None = None  # PD: ("sent" | "received", bytes, start_ns, end_ns)
    end_ns: int = 0  # the server was done with it: the reply written, or (prefill role) the KV handed on
    sink: Callable[["RequestTrace"], None] | None = None

    def close(self) -> None:
        """The server is done with the request: stamp it and send it to the tracer (once)."""
        sink, self.sink = self.sink, None
        if sink is not None:
            self.end_ns = time.time_ns()
            sink(self)


def parse_traceparent(value: str | None) -> tuple[bytes, bytes] | None:
    """W3C `traceparent` (00-<32 hex trace id>-<16 hex parent id>-<flags>) -> (trace id, parent id), or None."""
    parts = (value or "").strip().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, parent = bytes.fromhex(parts[1]), bytes.fromhex(parts[2])
    except ValueError:
        return None
    return (trace_id, parent) if any(trace_id) and any(parent) else None


@dataclass(slots=True)
class _SeqSteps:
    """What the step records said of one sequence so far."""

    queued_ns: int = 0
    # (step id, start ns, end ns, tokens cached before, tokens computed, the step's span id)
    chunks: list[tuple[int, int, int, int, int, bytes]] = field(default_factory=list)
    # runs of decode steps (consecutive: a decoding sequence is in every step until it ends or is preempted),
    # each [first step id, last step id, first's start ns, last's end ns, last's cached tokens, the end ns of
    # the step before the last]
    decode_runs: list[list[int]] = field(default_factory=list)
    num_decode_steps: int = 0
    preempted: list[tuple[int, int]] = field(default_factory=list)  # (step id, its start)
    last_step_id: int = -1


class SpanBuilder:
    """Joins step records and request stamps into spans; fed and drained on one thread (the exporter's)."""

    def __init__(self):
        self.steps_trace_id = os.urandom(16)  # one trace holds this process's engine steps
        self.seqs: dict[int, _SeqSteps] = {}
        self.waiting: list[tuple[float, int, RequestTrace]] = []  # (settle by, step id to see, request)
        self.last_step_id = -1
        self.finished: deque[int] = deque()
        self.finished_set: set[int] = set()

    def add_step(self, record: StepRecord) -> Span:
        """Take a step record; returns its span."""
        span_id = os.urandom(8)
        self.last_step_id = record.step_id
        for seq_id, ns in record.queued or ():
            if seq_id not in self.finished_set:
                self.seqs.setdefault(seq_id, _SeqSteps()).queued_ns = ns
        for seq_id in record.preempted or ():
            if seq_id in self.seqs:
                self.seqs[seq_id].preempted.append((record.step_id, record.start_ns))
        for seq_id, cached, n, prefilling in record.batch or ():
            if seq_id in self.finished_set:
                continue
            seq = self.seqs.get(seq_id)
            if seq is None:
                seq = self.seqs[seq_id] = _SeqSteps()
            seq.last_step_id = record.step_id
            if prefilling:
                seq.chunks.append((record.step_id, record.start_ns, record.end_ns, cached, n, span_id))
                continue
            seq.num_decode_steps += 1
            runs = seq.decode_runs
            if runs and runs[-1][1] == record.step_id - 1:
                run = runs[-1]
                run[1], run[3], run[4], run[5] = record.step_id, record.end_ns, cached, run[3]
            else:
                runs.append([record.step_id, record.step_id, record.start_ns, record.end_ns, cached, 0])
        if record.step_id % 1024 == 0:
            self._forget(record.step_id - FORGET_AFTER_STEPS)
        return step_span(record, self.steps_trace_id, span_id)

    def add_request(self, trace: RequestTrace, now_s: float) -> None:
        seq = self.seqs.get(trace.seq_id)
        wait_for = (seq.last_step_id if seq is not None else self.last_step_id) + 1
        self.waiting.append((now_s + SETTLE_S, wait_for, trace))

    def ready(self, now_s: float, flush: bool = False) -> list[Span]:
        """Spans of the requests whose steps are all in (or that waited SETTLE_S; all of them when flush)."""
        out, still = [], []
        for settle_by, wait_for, trace in self.waiting:
            if flush or now_s >= settle_by or self.last_step_id >= wait_for:
                seq = self.seqs.pop(trace.seq_id, None)
                if trace.seq_id >= 0:
                    self._finished(trace.seq_id)
                out.extend(request_spans(trace, seq, self.steps_trace_id))
            else:
                still.append((settle_by, wait_for, trace))
        self.waiting = still
        return out

    def _finished(self, seq_id: int) -> None:
        self.finished.append(seq_id)
        self.finished_set.add(seq_id)
        if len(self.finished) > REMEMBER_FINISHED:
            self.finished_set.discard(self.finished.popleft())

    def _forget(self, before_step_id: int) -> None:
        claimed = {trace.seq_id for _, _, trace in self.waiting}
        for seq_id in [s for s, seq in self.seqs.items() if seq.last_step_id < before_step_id and s not in claimed]:
            del self.seqs[seq_id]


# ---- spans: filled in place (a message passed to a constructor is copied: three times slower) --------
def set_attributes(target, values: dict) -> None:
    """Add a dict's items to a repeated KeyValue field (a span's, an event's, a resource's); None is left out."""
    add = target.add
    for k, v in values.items():
        if v is None:
            continue
        value = add(key=k).value
        if isinstance(v, bool):
            value.bool_value = v
        elif isinstance(v, int):
            value.int_value = v
        elif isinstance(v, float):
            value.double_value = v
        elif isinstance(v, list):  # of ints or of strings
            items = value.array_value.values
            for x in v:
                if isinstance(x, int):
                    items.add().int_value = x
                else:
                    items.add().string_value = x
        else:
            value.string_value = str(v)


def _seconds(later_ns: int, earlier_ns: int) -> float | None:
    return (later_ns - earlier_ns) / 1e9 if later_ns and earlier_ns else None


def _span(name: str, trace_id: bytes, span_id: bytes, start_ns: int, end_ns: int, values: dict,
          kind=INTERNAL, parent: bytes = b"") -> Span:
    span = Span(trace_id=trace_id, span_id=span_id, parent_span_id=parent, name=name, kind=kind,
                start_time_unix_nano=start_ns, end_time_unix_nano=end_ns)
    set_attributes(span.attributes, values)
    return span


def step_span(record: StepRecord, trace_id: bytes, span_id: bytes) -> Span:
    """`engine_step`: the step's batch by figures, and its prompt chunks' seq ids (a decoding request's spans
    name its steps); with speculation, what it drafted and accepted."""
    decode_seqs = record.num_decode_tokens - record.num_draft_tokens  # each decoding sequence: a token and its drafts
    spec = {} if record.num_accepted_tokens_per_pos is None else {
        "rooftop.spec.num_drafts": record.num_drafts,
        "rooftop.spec.num_draft_tokens": record.num_draft_tokens,
        "rooftop.spec.num_accepted_tokens": record.num_accepted_tokens,
        "rooftop.spec.num_accepted_tokens_per_pos": record.num_accepted_tokens_per_pos,
    }
    return _span("engine_step", trace_id, span_id, record.start_ns, record.end_ns, {
        "rooftop.step.id": record.step_id,
        "rooftop.step.kind": record.kind,
        "rooftop.step.num_seqs": record.num_seqs,
        "rooftop.step.prefill_tokens": record.num_tokens - record.num_decode_tokens,
        "rooftop.step.prefill_seqs": record.num_seqs - decode_seqs,
        "rooftop.step.decode_seqs": decode_seqs,
        "rooftop.step.preemptions": record.num_preemptions,
        "rooftop.step.prefix_hit_tokens": record.num_prefix_hit_tokens,
        "rooftop.step.seconds": record.seconds,
        "rooftop.step.device_seconds": record.device_seconds,
        "rooftop.step.prefill_seq_ids": [b[0] for b in record.batch or () if b[3]] or None,
        "rooftop.step.preempted_seq_ids": record.preempted or None,
        **spec,
    })


def request_spans(t: RequestTrace, seq: _SeqSteps | None, steps_trace_id: bytes) -> list[Span]:
    """`llm_request` and its children (`prefill_chunk`s, linked to their `engine_step`; `decode`;
    `kv_sent`/`kv_received`)."""
    seq = seq or _SeqSteps()
    span_id = os.urandom(8)
    children = []

    def child(name: str, start_ns: int, end_ns: int, values: dict, kind=INTERNAL) -> Span:
        children.append(_span(name, t.trace_id, os.urandom(8), start_ns, end_ns, values, kind, span_id))
        return children[-1]

    # a step that computes up to token index i samples token i: the first token's, and the last one's
    first_index, last_index = t.num_prompt_tokens, t.num_prompt_tokens + t.num_completion_tokens - 1
    first_token_ns = next((end for _, _, end, cached, n, _ in seq.chunks if cached + n == first_index), 0)
    finish_ns = next((end for _, _, end, cached, n, _ in reversed(seq.chunks) if cached + n == last_index), 0)
    if not finish_ns and seq.decode_runs:
        run = seq.decode_runs[-1]  # its last step sampled the last token, or (a stop seen a step late) the one before
        finish_ns = run[3] if run[4] + 1 == last_index else run[5] if run[4] == last_index else 0
    finish_ns = finish_ns or t.finish_ns
    scheduled_ns = seq.chunks[0][1] if seq.chunks else 0
    events = [(t.arrival_ns, "arrival", None), (seq.queued_ns, "queued", None), (first_token_ns, "first_token", None),
              (t.first_token_ns, "first_token_received", None),
              (t.first_token_written_ns, "first_token_written", None),
              (finish_ns, "finished", {"rooftop.finish_reason": t.finish_reason})]
    events += [(start, "preempted", {"rooftop.step.id": step_id}) for step_id, start in seq.preempted]
    resumed = 0
    for step_id, start, end, cached, n, step_span_id in seq.chunks:
        chunk = child("prefill_chunk", start, end, {"rooftop.step.id": step_id, "rooftop.chunk.tokens": n,
                                                    "rooftop.chunk.cached_tokens": cached})
        chunk.links.add(trace_id=steps_trace_id, span_id=step_span_id)
        if resumed < len(seq.preempted) and step_id > seq.preempted[resumed][0]:
            events.append((start, "resumed", {"rooftop.step.id": step_id}))
            resumed += 1
    for first, last, start, end, _, _ in seq.decode_runs:  # one per run of steps: a preemption ends one
        child("decode", start, end, {"rooftop.decode.first_step_id": first, "rooftop.decode.last_step_id": last,
                                     "rooftop.decode.num_steps": last - first + 1})
    if t.kv is not None:
        direction, num_bytes, start, end = t.kv
        child(f"kv_{direction}", start, end, {"rooftop.kv.bytes": num_bytes},
              kind=CLIENT if direction == "sent" else SERVER)
    first_ns = first_token_ns or t.first_token_ns
    request = _span("llm_request", t.trace_id, span_id, t.arrival_ns, max(t.end_ns, t.arrival_ns), {
        "gen_ai.request.id": t.request_id,
        "gen_ai.response.model": t.model,
        "gen_ai.request.max_tokens": t.max_tokens or None,
        "gen_ai.request.temperature": t.temperature,
        "gen_ai.request.top_p": t.top_p,
        "gen_ai.usage.prompt_tokens": t.num_prompt_tokens,
        "gen_ai.usage.completion_tokens": t.num_completion_tokens,
        "gen_ai.response.finish_reasons": [t.finish_reason] if t.finish_reason else None,
        "gen_ai.latency.time_in_queue": _seconds(scheduled_ns, seq.queued_ns),
        "gen_ai.latency.time_to_first_token": _seconds(first_ns, t.arrival_ns),
        "gen_ai.latency.e2e": _seconds(finish_ns, t.arrival_ns),
        "gen_ai.latency.time_in_model_prefill": _seconds(first_token_ns, scheduled_ns),
        "gen_ai.latency.time_in_model_decode": _seconds(finish_ns, first_ns),
        "gen_ai.latency.time_in_model_inference": _seconds(finish_ns, scheduled_ns or first_ns),
        "rooftop.engine.seq_id": t.seq_id,
        "rooftop.prefix_cache.hit_tokens": seq.chunks[0][3] if seq.chunks else None,  # before any preemption
        "rooftop.prefill.computed_tokens": sum(c[4] for c in seq.chunks),
        "rooftop.prefill.num_chunks": len(seq.chunks),
        "rooftop.decode.num_steps": seq.num_decode_steps,
        "rooftop.num_preemptions": len(seq.preempted),
    }, SERVER, t.parent_span_id)
    for ns, name, values in sorted((e for e in events if e[0]), key=lambda e: e[0]):
        event = request.events.add(name=name, time_unix_nano=ns)
        if values:
            set_attributes(event.attributes, values)
    return [request, *children]
