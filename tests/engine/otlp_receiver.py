"""A small OTLP/HTTP traces receiver on 127.0.0.1 for the engine's tracing tests: it decodes each POST with
opentelemetry-proto and keeps the spans, with their resource's attributes."""

import http.server
import threading
import time
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def value(v: AnyValue):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attrs(items) -> dict:
    return {kv.key: value(kv.value) for kv in items}


@dataclass
class Received:
    span: Span
    resource: dict
    attrs: dict = field(init=False)

    def __post_init__(self):
        self.attrs = attrs(self.span.attributes)

    @property
    def name(self) -> str:
        return self.span.name

    def events(self) -> dict[str, list]:
        """Event name -> [(time ns, attributes)], in time order."""
        out: dict[str, list] = {}
        for e in self.span.events:
            out.setdefault(e.name, []).append((e.time_unix_nano, attrs(e.attributes)))
        return out


class Receiver:
    """`url` takes OTLP/HTTP protobuf POSTs; `spans` holds what came, `posts` the content types seen."""

    def __init__(self):
        self.spans: list[Received] = []
        self.posts: list[str] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    receiver.posts.append(self.headers["Content-Type"])
                    for rs in req.resource_spans:
                        resource = attrs(rs.resource.attributes)
                        for ss in rs.scope_spans:
                            receiver.spans.extend(Received(s, resource) for s in ss.spans)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def requests(self, request_ids, timeout_s: float = 60.0) -> dict[str, list[Received]]:
        """Request id -> its llm_request spans, once every id has one (AssertionError after timeout_s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                got: dict[str, list[Received]] = {}
                for r in self.spans:
                    if r.name == "llm_request" and r.attrs["gen_ai.request.id"] in request_ids:
                        got.setdefault(r.attrs["gen_ai.request.id"], []).append(r)
            if set(got) == set(request_ids) or time.monotonic() > deadline:
                assert set(got) == set(request_ids), f"no span for {set(request_ids) - set(got)}"
                return got
            time.sleep(0.1)

    def children(self, parent: Received) -> list[Received]:
        with self.lock:
            return [r for r in self.spans if r.span.parent_span_id == parent.span.span_id
                    and r.span.trace_id == parent.span.trace_id]

    def steps(self, resource_instance: str) -> dict[int, Received]:
        """engine_step spans of one server (its service.instance.id), by step id."""
        with self.lock:
            return {r.attrs["rooftop.step.id"]: r for r in self.spans
                    if r.name == "engine_step" and r.resource["service.instance.id"] == resource_instance}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
