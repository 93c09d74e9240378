"""`--otlp-traces-endpoint`: real servers send request and step spans to a real OTLP/HTTP receiver on 127.0.0.1,
decoded with opentelemetry-proto; the spans say what each request went through, in order, and agree with the
steps' batches."""

import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from engine_server import request, sse_events, start_engine
from otlp_receiver import Receiver

from rooftop.bench.subproc import ChildServer, python_module

# pages of 16 (a 200-token prompt caches 12 of them), chunks of 64 (a 300-token prompt takes five)
COMMON = ("--context-length", "512", "--kv-cache-tokens", "4096", "--chunked-prefill-size", "64",
          "--page-size", "16")


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def traced(receiver):
    # the step loop in its own process: step records and the engine's seq ids cross the pipe to the tracer
    server = start_engine(*COMMON, "--engine-process", "on", "--otlp-traces-endpoint", receiver.url)
    yield server
    server.stop()


def generate(url: str, request_id: str, body: dict, chat: bool = False) -> dict:
    """The usage of one request sent with X-Request-Id (streamed ones ask for it)."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"model": "tiny", "temperature": 0, "ignore_eos": True, **body}
    if body.get("stream"):
        body["stream_options"] = {"include_usage": True}
    status, raw = request(url, path, body, headers={"X-Request-Id": request_id})
    assert status == 200, raw
    return sse_events(raw)[-2]["usage"] if body.get("stream") else json.loads(raw)["usage"]


def check_request(receiver: Receiver, span, usage: dict, written: bool = True) -> dict:
    """The stamps of one llm_request span in order, its chunks and decode steps against the steps' spans.
    written: the server wrote its first token to a client (a PD prefill worker sends it on with the KV)."""
    a, ev = span.attrs, span.events()
    assert (a["gen_ai.usage.prompt_tokens"], a["gen_ai.usage.completion_tokens"]) == (
        usage["prompt_tokens"], usage["completion_tokens"])
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    children = receiver.children(span)
    chunks = sorted((c for c in children if c.name == "prefill_chunk"), key=lambda c: c.span.start_time_unix_nano)
    arrival, queued = ev["arrival"][0][0], ev["queued"][0][0]
    first, finished = ev["first_token"][0][0], ev["finished"][0][0]
    assert span.span.start_time_unix_nano == arrival
    assert arrival <= queued <= chunks[0].span.start_time_unix_nano <= first <= finished <= span.span.end_time_unix_nano
    assert first <= ev["first_token_received"][0][0]
    if written:
        assert ev["first_token_received"][0][0] <= ev["first_token_written"][0][0]
    else:
        assert "first_token_written" not in ev
    assert first == chunks[-1].span.end_time_unix_nano  # the chunk that completes the prompt samples the token
    for name in ("time_in_queue", "time_to_first_token", "e2e", "time_in_model_prefill", "time_in_model_decode"):
        assert a[f"gen_ai.latency.{name}"] >= 0
    assert a["gen_ai.latency.time_to_first_token"] == pytest.approx((first - arrival) / 1e9)
    # prompt tokens computed = the prompt less its cached prefix
    hit = a["rooftop.prefix_cache.hit_tokens"]
    assert sum(c.attrs["rooftop.chunk.tokens"] for c in chunks) == usage["prompt_tokens"] - hit
    assert a["rooftop.prefill.num_chunks"] == len(chunks)
    # every chunk is in its step (linked), a prompt chunk of this sequence there, with the step's times
    steps = receiver.steps(span.resource["service.instance.id"])
    seq_id = a["rooftop.engine.seq_id"]
    for c in chunks:
        step = steps[c.attrs["rooftop.step.id"]]
        assert c.span.links[0].span_id == step.span.span_id
        assert seq_id in step.attrs["rooftop.step.prefill_seq_ids"]
        assert (c.span.start_time_unix_nano, c.span.end_time_unix_nano) == (
            step.span.start_time_unix_nano, step.span.end_time_unix_nano)
    # the first token comes from the prefill, each later one from a decode step (a length-ended request is
    # not scheduled after its last token): one run of steps, none preempted here
    decode = [c for c in children if c.name == "decode"]
    num_decode = usage["completion_tokens"] - 1
    assert a["rooftop.decode.num_steps"] == num_decode
    if num_decode:
        d = decode[0].attrs
        first_step, last_step = d["rooftop.decode.first_step_id"], d["rooftop.decode.last_step_id"]
        assert len(decode) == 1 and d["rooftop.decode.num_steps"] == last_step - first_step + 1 == num_decode
        # launched before the previous step is read back (overlap): after the last chunk's, not after its end
        assert first_step > chunks[-1].attrs["rooftop.step.id"]
        assert (decode[0].span.start_time_unix_nano, decode[0].span.end_time_unix_nano) == (
            steps[first_step].span.start_time_unix_nano, steps[last_step].span.end_time_unix_nano)
        assert all(steps[i].attrs["rooftop.step.decode_seqs"] >= 1 for i in range(first_step, last_step + 1))
        assert finished == steps[last_step].span.end_time_unix_nano
    else:
        assert decode == []
    return {"chunks": chunks, "hit": hit, "steps": steps, "decode": decode}


def test_each_request_has_a_span_under_its_client_id_with_its_stamps_in_order(traced, receiver):
    bodies = {
        "req-stream": ({"prompt": "hello tracing", "max_tokens": 6, "stream": True}, False),
        "req-json": ({"prompt": "another one", "max_tokens": 4}, False),
        "req-long": ({"prompt": "x" * 300, "max_tokens": 3}, False),  # 301 tokens: five chunks of 64 or less
        "req-chat": ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5,
                      "stream": True}, True),
        "req-one": ({"prompt": "one", "max_tokens": 1}, False),  # no decode step
    }
    with ThreadPoolExecutor(len(bodies)) as pool:
        usages = dict(zip(bodies, pool.map(lambda kv: generate(traced.url, kv[0], kv[1][0], kv[1][1]),
                                           bodies.items()), strict=True))
    got = receiver.requests(set(bodies))
    for request_id, spans in got.items():
        assert len(spans) == 1, request_id
        seen = check_request(receiver, spans[0], usages[request_id])
        assert spans[0].resource["service.name"] == "rooftop-engine"
        assert spans[0].resource["rooftop.engine.role"] == "single"
        if request_id == "req-long":
            assert len(seen["chunks"]) >= 5
    # every step's batch is what the server's request spans (all of them) say they ran in it
    instance = got["req-long"][0].resource["service.instance.id"]
    steps = receiver.steps(instance)
    prefill_tokens, decode_seqs = dict.fromkeys(steps, 0), dict.fromkeys(steps, 0)
    with receiver.lock:
        served = [r for r in receiver.spans if r.name == "llm_request" and r.resource["service.instance.id"] == instance]
    for span in served:
        for c in receiver.children(span):
            if c.name == "prefill_chunk":
                prefill_tokens[c.attrs["rooftop.step.id"]] += c.attrs["rooftop.chunk.tokens"]
            elif c.name == "decode":
                for i in range(c.attrs["rooftop.decode.first_step_id"], c.attrs["rooftop.decode.last_step_id"] + 1):
                    decode_seqs[i] += 1
    for step_id, step in steps.items():
        s = step.attrs
        assert (s["rooftop.step.prefill_tokens"], s["rooftop.step.decode_seqs"]) == (
            prefill_tokens[step_id], decode_seqs[step_id])
        assert s["rooftop.step.kind"] == ("prefill" if s["rooftop.step.prefill_seqs"] else "decode")
        assert s["rooftop.step.num_seqs"] == s["rooftop.step.prefill_seqs"] + s["rooftop.step.decode_seqs"]


def test_a_cached_prefix_is_not_in_the_chunks_and_a_traceparent_is_followed(traced, receiver):
    prompt = "p" * 199  # 200 tokens with <bos>: 12 full pages of 16
    first = generate(traced.url, "prefix-1", {"prompt": prompt, "max_tokens": 2})
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    status, raw = request(traced.url, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 2,
                                                          "temperature": 0, "ignore_eos": True},
                          headers={"X-Request-Id": "prefix-2", "traceparent": f"00-{trace_id}-{parent}-01"})
    assert status == 200
    got = receiver.requests({"prefix-1", "prefix-2"})
    assert check_request(receiver, got["prefix-1"][0], first)["hit"] == 0
    assert check_request(receiver, got["prefix-2"][0], json.loads(raw)["usage"])["hit"] == 192
    span = got["prefix-2"][0].span
    assert (span.trace_id.hex(), span.parent_span_id.hex()) == (trace_id, parent)


def test_without_the_flag_nothing_is_sent():
    """Not even to the OTLP endpoint the environment names (vLLM's workers read it; this engine does not)."""
    quiet = Receiver()
    server = start_engine(*COMMON, env_extra={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": quiet.url})
    try:
        for i in range(2):
            generate(server.url, f"quiet-{i}", {"prompt": "nothing to see", "max_tokens": 3})
    finally:
        server.stop()
        quiet.stop()
    assert quiet.posts == []


def test_an_endpoint_that_is_down_costs_its_spans_only_and_says_so_once():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    server = start_engine(*COMMON, "--otlp-traces-endpoint", f"http://127.0.0.1:{port}/v1/traces")
    try:
        for i in range(4):
            usage = generate(server.url, f"down-{i}", {"prompt": "the collector is down", "max_tokens": 4})
            assert usage["completion_tokens"] == 4
            time.sleep(0.3)  # a few export rounds, each failing
        status, _ = request(server.url, "/health")
        assert status == 200
    finally:
        server.stop()
    said = [line for line in server.lines if "spans are dropped" in line]
    assert len(said) == 1, server.lines[-20:]
    assert f"127.0.0.1:{port}" in said[0]
    assert any("dropped (endpoint failing)" in line for line in server.lines)


def start_router(prefill_url: str, decode_url: str) -> ChildServer:
    argv = python_module("rooftop.engine.pd.router", "--prefill", prefill_url, "--decode", decode_url, "--port", "0",
                         "--parent-pid", str(os.getpid()))
    return ChildServer(argv, "rooftop-router ready on", timeout_s=120)


def test_a_pd_pair_exports_the_kv_sent_and_received_under_one_request_id_and_trace(receiver):
    roles = [("--role", "prefill"), ("--role", "decode")]
    with ThreadPoolExecutor(2) as pool:
        servers = list(pool.map(lambda r: start_engine(*COMMON, *r, "--otlp-traces-endpoint", receiver.url), roles))
    try:
        router = start_router(servers[0].url, servers[1].url)
        try:
            usages = {"pd-json": generate(router.url, "pd-json", {"prompt": "y" * 100, "max_tokens": 5}),
                      "pd-stream": generate(router.url, "pd-stream", {"prompt": "disaggregated", "max_tokens": 4,
                                                                      "stream": True})}
        finally:
            router.stop()
    finally:
        for s in servers:
            s.stop()
    got = receiver.requests(set(usages))
    for request_id, spans in got.items():
        by_role = {s.resource["rooftop.engine.role"]: s for s in spans}
        assert set(by_role) == {"prefill", "decode"}
        prefill, decode = by_role["prefill"], by_role["decode"]
        assert prefill.span.trace_id == decode.span.trace_id
        usage = usages[request_id]
        # the prefill worker: the prompt in chunks and the first token, then the KV out
        check_request(receiver, prefill, {**usage, "completion_tokens": 1}, written=False)
        sent = [c for c in receiver.children(prefill) if c.name == "kv_sent"]
        received = [c for c in receiver.children(decode) if c.name == "kv_received"]
        assert len(sent) == len(received) == 1
        assert sent[0].attrs["rooftop.kv.bytes"] == received[0].attrs["rooftop.kv.bytes"] > 0
        # one clock on one host: the decode worker took the frame while the prefill worker sent it
        assert sent[0].span.start_time_unix_nano <= received[0].span.start_time_unix_nano
        assert received[0].span.end_time_unix_nano <= sent[0].span.end_time_unix_nano
        # the decode worker: the rest of the tokens, no prompt computed
        d = decode.attrs
        assert (d["gen_ai.usage.prompt_tokens"], d["gen_ai.usage.completion_tokens"]) == (
            usage["prompt_tokens"], usage["completion_tokens"])
        assert d["rooftop.prefill.num_chunks"] == 0
        assert d["rooftop.decode.num_steps"] == usage["completion_tokens"] - 1
        assert decode.events()["first_token_written"][0][0] >= received[0].span.end_time_unix_nano
