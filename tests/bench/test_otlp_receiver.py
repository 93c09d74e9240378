"""The OTLP/HTTP receiver on 127.0.0.1: protobuf and JSON bodies become spans; a bad body is refused and counted;
a bad --otlp-receiver is refused with the flag's example."""

import asyncio

import aiohttp
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from rooftop.bench.otlp_receiver import OtlpReceiver
from rooftop.spec.bench import BenchSettings, SettingError


def export(request_id: str) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.instance.id").value.string_value = "inst-1"
    span = rs.scope_spans.add().spans.add(name="llm_request", span_id=b"\x01" * 8, trace_id=b"\x02" * 16,
                                          start_time_unix_nano=10, end_time_unix_nano=20)
    span.attributes.add(key="gen_ai.request.id").value.string_value = request_id
    span.events.add(name="arrival", time_unix_nano=11)
    return req


def test_protobuf_and_json_bodies_and_a_bad_one():
    async def go():
        async with OtlpReceiver("127.0.0.1", 0) as rx, aiohttp.ClientSession() as http:
            proto = await http.post(rx.endpoint, data=export("a").SerializeToString(),
                                    headers={"Content-Type": "application/x-protobuf"})
            js = await http.post(rx.endpoint, data=json_format.MessageToJson(export("b")),
                                 headers={"Content-Type": "application/json"})
            bad = await http.post(rx.endpoint, data=b"\xff\xff not protobuf",
                                  headers={"Content-Type": "application/x-protobuf"})
            return proto.status, js.status, bad.status, rx.take(), rx.collected
    proto, js, bad, got, after = asyncio.run(go())
    assert (proto, js, bad) == (200, 200, 400)
    assert got.request_ids == {"a", "b"} and got.posts == 3 and got.bad_posts == 1
    span = got.spans[0]
    assert (span.instance, span.start_ns, span.events[0][:2]) == ("inst-1", 10, ("arrival", 11))
    assert after.spans == [] and after.posts == 0  # take() starts afresh


def test_a_bad_address_is_refused():
    with pytest.raises(SettingError) as err:
        BenchSettings(otlp_receiver="4318").check()
    assert "--otlp-receiver '4318' is not HOST:PORT" in err.value.problem and "127.0.0.1:4318" in err.value.fix
