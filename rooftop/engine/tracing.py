"""`--otlp-traces-endpoint`: request and step spans POSTed as OTLP/HTTP protobuf from a thread of its own.

The step loop and the event loop only append records to a bounded queue (a full queue drops, counted,
never blocks); every EXPORT_EVERY_S the exporter's thread joins them into spans (spans.py), encodes them
with opentelemetry-proto's classes and POSTs them in batches. An endpoint that fails loses its spans, said
once on stderr until it answers again; what is queued at shutdown is sent then.
"""

import http.client
import os
import sys
import threading
import time
import uuid
from collections import deque
from urllib.parse import urlsplit

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from rooftop.engine.engine import StepRecord
from rooftop.engine.spans import RequestTrace, SpanBuilder, parse_traceparent, set_attributes

EXPORT_EVERY_S = 0.2
MAX_QUEUED = 1 << 16  # step records and requests waiting for the exporter's thread
MAX_SPANS_PER_POST = 512
POST_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 10.0


def log(msg: str) -> None:
    print(f"rooftop-engine: {msg}", file=sys.stderr, flush=True)


class Tracer:
    """Spans of one server's requests and engine steps, to an OTLP/HTTP endpoint."""

    def __init__(self, endpoint: str, model: str, role: str):
        self.endpoint = endpoint
        self.model = model
        parts = urlsplit(endpoint)
        self._http = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self._host, self._path = parts.netloc, parts.path or "/v1/traces"
        self._resource = Resource()
        set_attributes(self._resource.attributes, {
            "service.name": "rooftop-engine", "service.instance.id": uuid.uuid4().hex, "process.pid": os.getpid(),
            "rooftop.engine.role": role, "gen_ai.response.model": model})
        self._items: deque = deque()
        self._lock = threading.Lock()  # the drop count: the engine thread and the event loop both put
        self.num_queue_drops = 0
        self.num_sent = 0  # spans the endpoint took
        self.num_dropped = 0  # spans made and not taken
        self._failing = False
        self._said_full = False
        self._builder = SpanBuilder()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rooftop-otlp", daemon=True)
        self._thread.start()

    # ---- the step loop's and the event loop's side: append, never block -------------------------
    def attach(self, engine) -> None:
        """Take every step record of an Engine (trace_steps set) or an EngineProcess."""
        engine.step_listeners.append(self._put)

    def start(self, request_id: str | None, traceparent: str | None = None, trace_id_hex: str | None = None,
              arrival_ns: int | None = None) -> RequestTrace:
        """A request's trace, arrived now (or at arrival_ns); request_id "" until the reply's id is known."""
        parsed = parse_traceparent(traceparent)
        if parsed is not None:
            trace_id, parent = parsed
        else:
            trace_id, parent = _trace_id(trace_id_hex), b""
        return RequestTrace(request_id or "", arrival_ns or time.time_ns(), trace_id, parent, model=self.model,
                            sink=self._put)

    def _put(self, item: StepRecord | RequestTrace) -> None:
        if len(self._items) < MAX_QUEUED:
            self._items.append(item)
        else:
            with self._lock:
                self.num_queue_drops += 1

    def stop(self) -> None:
        """Send what is queued (the requests still waiting for steps too) and end the thread; once."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(STOP_TIMEOUT_S)
        if self.num_dropped or self.num_queue_drops:
            log(f"OTLP traces: {self.num_sent} spans sent to {self.endpoint}, {self.num_dropped} dropped "
                f"(endpoint failing), {self.num_queue_drops} records dropped (queue full)")

    # ---- the exporter's thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            stopping = self._stop.wait(EXPORT_EVERY_S)
            try:
                self._export(self._build(flush=stopping))
            except Exception as exc:  # noqa: BLE001 - tracing must never take the server down
                log(f"OTLP traces: export failed: {type(exc).__name__}: {exc}")
            if stopping:
                return

    def _build(self, flush: bool) -> list[Span]:
        spans, builder = [], self._builder
        now = time.monotonic()
        while self._items:
            item = self._items.popleft()
            if isinstance(item, StepRecord):
                spans.append(builder.add_step(item))
            else:
                builder.add_request(item, now)
        spans.extend(builder.ready(now, flush))
        if self.num_queue_drops and not self._said_full:
            self._said_full = True
            log(f"OTLP traces: more than {MAX_QUEUED} records waited for export; the newest are dropped "
                "(counted; said once)")
        return spans

    def _export(self, spans: list[Span]) -> None:
        for at in range(0, len(spans), MAX_SPANS_PER_POST):
            batch = spans[at:at + MAX_SPANS_PER_POST]
            why = self._post(batch)
            if why is None:
                self.num_sent += len(batch)
                if self._failing:
                    self._failing = False
                    log(f"OTLP traces: {self.endpoint} answers again; spans are sent")
                continue
            # one failure per round: the rest of this round is dropped rather than waiting on it again
            self.num_dropped += len(spans) - at
            if not self._failing:
                self._failing = True
                log(f"OTLP traces: cannot send to {self.endpoint} ({why}); spans are dropped until it answers")
            return

    def _post(self, spans: list[Span]) -> str | None:
        """POST one ExportTraceServiceRequest; None when the endpoint took it, else why not."""
        body = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
            resource=self._resource,
            scope_spans=[ScopeSpans(scope=InstrumentationScope(name="rooftop.engine"), spans=spans)])],
        ).SerializeToString()
        conn = self._http(self._host, timeout=POST_TIMEOUT_S)
        try:
            conn.request("POST", self._path, body=body, headers={"Content-Type": "application/x-protobuf"})
            resp = conn.getresponse()
            resp.read()
        except (OSError, http.client.HTTPException) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()
        return None if 200 <= resp.status < 300 else f"HTTP {resp.status}"


def _trace_id(hex32: str | None) -> bytes:
    """A trace id: the 32 hex digits given (a PD router's, so both workers' spans share a trace), else random."""
    if hex32 and len(hex32) == 32:
        try:
            return bytes.fromhex(hex32)
        except ValueError:
            pass
    return os.urandom(16)
