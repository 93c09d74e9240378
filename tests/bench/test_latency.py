"""TTFT parts and ITL outlier causes from a real engine's spans: the embedded engine (tiny, CPU) exporting to
rooftop bench's OTLP receiver on 127.0.0.1, real requests through the whole bench path. No timing is asserted:
only relations between stamps of one request (its parts sum to its TTFT) and which cause each outlier got."""

import asyncio
import json
import socket

import pytest

from rooftop.bench.latency import NO_SPANS, PARTS
from rooftop.bench.sweep import BenchConfig, run_bench
from tests.engine.engine_server import start_engine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench(engine_url: str, receiver_port: int, tmp_path, **settings):
    cfg = BenchConfig(base_url=engine_url, out_dir=tmp_path, otlp_receiver=f"127.0.0.1:{receiver_port}",
                      telemetry=False, warmup=1, **settings)
    cfg.check()
    return asyncio.run(run_bench(cfg))


def within(rec: dict) -> bool:
    """Its parts sum to its TTFT within 2% or 1 ms."""
    b = rec["ttft_breakdown"]
    total = sum(b[f"{p}_ms"] for p in PARTS)
    return abs(total - b["ttft_ms"]) <= max(0.02 * b["ttft_ms"], 1.0) and abs(b["residual_ms"]) <= max(
        0.02 * b["ttft_ms"], 1.0)


def read_records(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]


def write_trace(path, rows) -> str:
    path.write_text("".join(json.dumps({"timestamp_ms": t, "input_len": i, "output_len": o}) + "\n"
                            for t, i, o in rows))
    return str(path)


@pytest.fixture(scope="module")
def traced():
    """An engine sending spans to a port this module's benches listen on; 128-token prompt chunks."""
    port = free_port()
    server = start_engine("--otlp-traces-endpoint", f"http://127.0.0.1:{port}/v1/traces",
                          "--chunked-prefill-size", "128")
    try:
        yield server.url, port
    finally:
        server.stop()


def test_long_prompts_make_the_itl_outliers_and_every_ttft_sums(traced, tmp_path):
    url, port = traced
    # four short requests decode while 512-token prompts (four chunks each) arrive among them
    rows = [(0, 8, 96)] * 4 + [(150 + 250 * k, 512, 1) for k in range(6)]
    out = bench(url, port, tmp_path, dataset="trace", dataset_path=write_trace(tmp_path / "t.jsonl", rows),
                concurrency=[], num_requests=None)
    assert out.aborted is None
    level = out.summary["levels"][0]
    spans = level["server_spans"]
    records = [r for r in read_records(tmp_path) if not r["warmup"]]
    assert len(records) == len(rows) and all(r["status"] == "ok" for r in records)
    assert spans["joined"] == spans["requests"] == len(rows) and spans["joined_share"] == 1.0
    for r in records:
        assert r["request_id"] and r["ttft_breakdown"] is not None, r
        assert within(r), r["ttft_breakdown"]
        assert all(r["ttft_breakdown"][f"{p}_ms"] >= -1.0 for p in PARTS), r["ttft_breakdown"]
    long = [r for r in records if r["expected_input_len"] == 512]
    assert all(r["ttft_breakdown"]["prefill_chunks"] >= 4 for r in long)
    for p in ("p50", "p99"):
        assert within({"ttft_breakdown": spans["ttft_breakdown"][p]})
    outliers = [o for r in records for o in r["itl_outliers"]]
    assert outliers, "long prompts among decodes made no ITL outlier"
    by_prefill = [o for o in outliers if o["cause"] == "prefill_chunk"]
    assert len(by_prefill) >= 0.9 * len(outliers), spans["itl_outliers"]
    assert all(0 < o["prefill_tokens"] for o in by_prefill)
    assert spans["itl_outliers"]["count"] == len(outliers)
    assert spans["itl_outliers"]["causes"].get("prefill_chunk", 0) == len(by_prefill)


def test_without_long_prompts_no_outlier_is_a_prefill_chunk(traced, tmp_path):
    url, port = traced
    # one request at a time: no other prompt is ever prefilled while one decodes, however the steps are timed
    out = bench(url, port, tmp_path, dataset="random", input_len=8, output_len=48, concurrency=[1], num_requests=4)
    spans = out.summary["levels"][0]["server_spans"]
    records = [r for r in read_records(tmp_path) if not r["warmup"]]
    assert spans["joined"] == 4
    assert all(within(r) for r in records)
    assert not [o for r in records for o in r["itl_outliers"] if o["cause"] == "prefill_chunk"]


def test_no_spans_says_so_and_keeps_the_level(tmp_path):
    server = start_engine()
    try:
        out = bench(server.url, free_port(), tmp_path, dataset="random", input_len=8, output_len=8,
                    concurrency=[2], num_requests=4)
    finally:
        server.stop()
    level = out.summary["levels"][0]
    assert level["completed"] == 4 and level["failed"] == 0
    records = [r for r in read_records(tmp_path) if not r["warmup"]]
    assert len(records) == 4 and all(r["status"] == "ok" and "ttft_breakdown" not in r for r in records)
    assert level["server_spans"]["joined"] == 0 and level["server_spans"]["note"] == NO_SPANS
    assert "--otlp-traces-endpoint http://HOST:PORT/v1/traces" in level["server_spans"]["note"]
    assert level["ttft_ms"]["n"] == 4
