"""timeline.json.gz from a real bench run: the embedded engine (tiny, CPU) sending its spans to the bench's
OTLP receiver, long prompts arriving in chunks while short requests decode. Only relations between events are
checked (well-formed, nested, ordered), no timing value."""

import gzip
import json

from rooftop.bench.timeline import REQUEST_TID, SCHEMA
from rooftop.profile.kineto import _open, _parse, _Reader
from rooftop.profile.trace import TraceBuilder
from tests.bench.test_latency import bench, free_port, read_records, write_trace
from tests.engine.engine_server import start_engine

EPS_US = 0.002  # rounding of ns to µs with 3 decimals, twice


def read_back(path):
    builder = TraceBuilder(str(path), "kineto")
    with _open(path) as stream:
        _parse(_Reader(stream, path), builder)
    return builder.build()


def run_with_spans(tmp_path):
    port = free_port()
    server = start_engine("--otlp-traces-endpoint", f"http://127.0.0.1:{port}/v1/traces",
                          "--chunked-prefill-size", "128")
    try:
        rows = [(0, 8, 48)] * 3 + [(100 + 200 * k, 384, 1) for k in range(3)]
        out = bench(server.url, port, tmp_path, dataset="trace", concurrency=[], num_requests=None,
                    dataset_path=write_trace(tmp_path / "t.jsonl", rows))
    finally:
        server.stop()
    return out, rows


def test_the_timeline_puts_requests_and_steps_on_one_axis(tmp_path):
    out, rows = run_with_spans(tmp_path)
    assert out.aborted is None and out.summary["levels"][0]["server_spans"]["joined"] == len(rows)
    doc = json.loads(gzip.decompress((tmp_path / "timeline.json.gz").read_bytes()))
    assert doc["otherData"]["schema"] == SCHEMA and "not included" in doc["otherData"]["gpu_kernels"]
    events = doc["traceEvents"]
    for e in events:
        assert e["ph"] in ("X", "i", "M") and "pid" in e and "tid" in e, e
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e["ts"], float | int), e
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    records = {r["index"]: r for r in read_records(tmp_path) if not r["warmup"]}

    # each request's track nests within its request (E2E) and its parts within its TTFT
    by_tid: dict[int, list[dict]] = {}
    for e in events:
        if e["ph"] != "M" and e["tid"] >= REQUEST_TID:
            by_tid.setdefault(e["tid"], []).append(e)
    assert len(by_tid) == len(rows)
    for tid, evs in by_tid.items():
        rec = records[tid - REQUEST_TID]
        assert names[evs[0]["pid"], tid] == f"request {rec['request_id']}"
        req = next(e for e in evs if e["name"] == "request")
        ttft = next(e for e in evs if e["name"] == "ttft")
        assert req["args"]["request_id"] == rec["request_id"]
        assert ttft["ts"] == req["ts"] and ttft["dur"] <= req["dur"]
        for e in evs:
            end = e["ts"] + e.get("dur", 0)
            assert req["ts"] - EPS_US <= e["ts"] and end <= req["ts"] + req["dur"] + EPS_US, e
        parts = [e for e in evs if e["name"] in ("client wait", "client to server", "queue", "prefill",
                                                 "kv transfer", "emission", "prefill chunk")]
        assert any(e["name"] == "prefill" for e in parts)
        for e in parts:
            assert ttft["ts"] - EPS_US <= e["ts"] and e["ts"] + e["dur"] <= ttft["ts"] + ttft["dur"] + EPS_US, e
        chunks = [e for e in evs if e["name"] == "prefill chunk"]
        assert len(chunks) == rec["ttft_breakdown"]["prefill_chunks"]
        assert len([e for e in evs if e["name"] == "token"]) == len(rec["chunk_ns"])
        assert [e["ts"] for e in evs if e["name"] == "token"] == [round(ns / 1000, 3) for ns in rec["chunk_ns"]]

    # engine steps: one track, in order, none overlapping the one before, each within its launch and read-back
    steps = [e for e in events if e["ph"] == "X" and e["name"].startswith("step")]
    assert steps and {e["tid"] for e in steps} == {1}
    assert any(e["args"]["prefill_tokens"] > 0 for e in steps) and all("num_seqs" in e["args"] for e in steps)
    for a, b in zip(steps, steps[1:], strict=False):
        assert a["ts"] + a["dur"] <= b["ts"] + EPS_US, (a, b)
    for e in steps:
        assert e["args"]["launched_us"] <= e["ts"] + EPS_US

    # rooftop's own trace reader (its Kineto parser: load_trace itself refuses a trace without kernels or CPU
    # ops) takes it back: every request and step
    trace = read_back(tmp_path / "timeline.json.gz")
    kept = list(trace.annotations.name)
    assert sum(trace.names[i] == "request" for i in kept) == len(rows)
    assert sum(trace.names[i].startswith("step") for i in kept) == len(steps)
