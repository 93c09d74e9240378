"""An OTLP/HTTP trace receiver (POST /v1/traces) for the spans an engine exports while a level runs
(`rooftop bench --otlp-receiver HOST:PORT`; the engine started with `--otlp-traces-endpoint
http://HOST:PORT/v1/traces`). Bodies are ExportTraceServiceRequest, protobuf (decoded with opentelemetry-proto)
or OTLP's JSON encoding; spans are kept in memory, flattened to `SpanRec`, until a level takes them."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from rooftop.errors import RooftopError


@dataclass(slots=True)
class SpanRec:
    """One span as the analysis needs it: times are the sender's unix-epoch ns (time.time_ns())."""

    name: str
    span_id: bytes
    parent_span_id: bytes
    start_ns: int
    end_ns: int
    attributes: dict
    events: list[tuple[str, int, dict]]  # (name, time ns, attributes)
    instance: str  # the resource's service.instance.id (one per server process), else its service.name


@dataclass(slots=True)
class Collected:
    """What arrived since a level last took it."""

    spans: list[SpanRec] = field(default_factory=list)
    request_ids: set[str] = field(default_factory=set)  # of its llm_request spans
    posts: int = 0
    bad_posts: int = 0
    last_post_s: float = 0.0  # time.monotonic() of the last POST, 0 before any


_VLLM_ID = re.compile(r"(?:chat)?cmpl-(.+?)(?:-\d+)?")


def client_request_id(span_id: str) -> str:
    """The client's X-Request-Id in a span's gen_ai.request.id: vLLM's `cmpl-ID-N` / `chatcmpl-ID` unwrapped,
    anything else as it is (the embedded engine keeps the client's id)."""
    m = _VLLM_ID.fullmatch(span_id)
    return m.group(1) if m else span_id


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def _attributes(items) -> dict:
    return {kv.key: _value(kv.value) for kv in items}


def flatten(request: ExportTraceServiceRequest) -> list[SpanRec]:
    """Every span of an export request, with its resource's instance id."""
    out = []
    for rs in request.resource_spans:
        res = _attributes(rs.resource.attributes)
        instance = str(res.get("service.instance.id") or res.get("service.name") or "")
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(SpanRec(s.name, s.span_id, s.parent_span_id, s.start_time_unix_nano, s.end_time_unix_nano,
                                   _attributes(s.attributes),
                                   [(e.name, e.time_unix_nano, _attributes(e.attributes)) for e in s.events], instance))
    return out


def decode_body(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """An OTLP/HTTP body, protobuf or JSON by its content type; raises ValueError when it is neither."""
    request = ExportTraceServiceRequest()
    try:
        if "json" in content_type:
            json_format.Parse(body, request, ignore_unknown_fields=True)
        else:
            request.ParseFromString(body)
    except (DecodeError, json_format.ParseError) as exc:
        raise ValueError(str(exc)) from exc
    return request


class OtlpReceiver:
    """Listens on host:port while the bench runs; `take()` hands over what came and starts afresh."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.collected = Collected()
        self._runner: web.AppRunner | None = None

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        content_type = request.headers.get("Content-Type", "application/x-protobuf")
        got = self.collected
        got.posts += 1
        got.last_post_s = time.monotonic()
        try:
            spans = flatten(decode_body(body, content_type))
        except ValueError as exc:
            got.bad_posts += 1
            return web.Response(status=400, text=f"not an OTLP ExportTraceServiceRequest: {exc}")
        got.spans.extend(spans)
        # as the join names them: vLLM's cmpl-ID-N unwrapped to the client's ID (latency.client_request_id)
        got.request_ids.update(client_request_id(str(s.attributes.get("gen_ai.request.id")))
                               for s in spans if s.name == "llm_request")
        if "json" in content_type:
            return web.Response(text="{}", content_type="application/json")
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def start(self) -> None:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise RooftopError(f"--otlp-receiver {self.host}:{self.port}: cannot listen there ({exc.strerror})",
                               "pick a free port, e.g. --otlp-receiver 127.0.0.1:4318") from exc
        if self.port == 0:  # an ephemeral port: the one the OS gave
            self.port = site._server.sockets[0].getsockname()[1]

    @property
    def endpoint(self) -> str:
        """The URL to give the engine's --otlp-traces-endpoint."""
        return f"http://{self.host}:{self.port}/v1/traces"

    def take(self) -> Collected:
        got, self.collected = self.collected, Collected()
        return got

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> OtlpReceiver:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
