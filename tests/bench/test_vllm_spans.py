"""vLLM's request spans (one llm_request a request, no events or steps) joined to the client's records: its
`cmpl-<X-Request-Id>-<n>` names unwrapped, queue, prefill and decode from its gen_ai.latency.* attributes."""

import time

from rooftop.bench.clocks import measure_local
from rooftop.bench.latency import join
from rooftop.bench.otlp_receiver import SpanRec, client_request_id
from rooftop.bench.records import RequestRecord


def test_vllms_span_names_are_unwrapped_to_the_clients_id():
    assert client_request_id("cmpl-5f2a9c0d1e3b4a5968778899-0") == "5f2a9c0d1e3b4a5968778899"
    assert client_request_id("chatcmpl-5f2a9c0d1e3b4a5968778899") == "5f2a9c0d1e3b4a5968778899"
    assert client_request_id("5f2a9c0d1e3b4a5968778899") == "5f2a9c0d1e3b4a5968778899"  # the embedded engine's


def vllm_span(request_id: str, arrival_ns: int, queue_s: float, prefill_s: float, ttft_s: float) -> SpanRec:
    """A span with the attributes vLLM 0.32 sets (vllm/tracing: gen_ai.latency.* in seconds)."""
    return SpanRec("llm_request", b"s" * 8, b"", arrival_ns, arrival_ns + int(0.5e9), {
        "gen_ai.request.id": f"cmpl-{request_id}-0", "gen_ai.latency.time_in_queue": queue_s,
        "gen_ai.latency.time_in_model_prefill": prefill_s, "gen_ai.latency.time_in_model_decode": 0.3,
        "gen_ai.latency.time_to_first_token": ttft_s, "gen_ai.latency.e2e": 0.5,
        "gen_ai.usage.prompt_tokens": 48, "gen_ai.usage.completion_tokens": 12}, [], "vllm")


def test_a_vllm_span_gives_queue_prefill_and_decode_and_the_parts_sum():
    local = measure_local()
    now = time.perf_counter_ns()
    rec = RequestRecord(index=0, concurrency=1, request_rate=None, repeat=0, warmup=False, decided_ns=now)
    rec.request_id, rec.sent_ns = "ab" * 12, now + 100_000
    arrival_client = rec.sent_ns + 300_000  # the server had it 0.3 ms after the send
    # vLLM: 2 ms in queue, 20 ms prefill, its TTFT 23 ms (1 ms before the queue); the client reads it 0.4 ms later
    rec.chunk_ns = [arrival_client + 23_000_000 + 400_000, arrival_client + 40_000_000]
    rec.chunk_tokens, rec.status = [1, 1], "ok"
    span = vllm_span(rec.request_id, arrival_client + local.offset_ns, 0.002, 0.020, 0.023)
    got = join([rec], [span], local)
    assert got["joined"] == 1 and "no engine steps" in got["note"]
    b = rec.ttft_breakdown
    assert b["source"] == "vllm gen_ai.latency.*"
    assert (b["queue_ms"], b["prefill_ms"], b["decode_ms"], b["server_other_ms"]) == (2.0, 20.0, 300.0, 1.0)
    assert abs(b["client_to_server_ms"] - 0.3) < 0.05 and abs(b["emission_ms"] - 0.4) < 0.05
    parts = sum(b[k] for k in ("client_wait_ms", "client_to_server_ms", "queue_ms", "prefill_ms", "emission_ms",
                               "server_other_ms"))
    assert abs(parts - b["ttft_ms"]) < 0.05 and abs(b["residual_ms"]) < 0.05
    assert rec.itl_outliers == []
