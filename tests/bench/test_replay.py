"""A trace replayed against the synthetic server on its own clock: each record keeps its scheduled and its actual
send time; a cut is said; a bad trace sends nothing."""

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from rooftop.bench.sweep import BenchConfig, run_bench
from rooftop.errors import RooftopError

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


def replay(url, tmp_path, notes, **kw):
    cfg = BenchConfig(base_url=url, concurrency=[], warmup=1, input_len=16, output_len=2, out_dir=tmp_path,
                      telemetry=False, **{"num_requests": None, **kw})
    return asyncio.run(run_bench(cfg, on_note=notes.append))


def test_a_replay_records_scheduled_and_actual_send_times(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    notes = []
    out = replay(srv.url, tmp_path, notes, dataset="mooncake", dataset_path=str(DATA / "mooncake.jsonl"),
                 trace_speedup=4.0)
    recs = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    warm, measured = [r for r in recs if r["warmup"]], [r for r in recs if not r["warmup"]]
    assert len(warm) == 1 and warm[0]["scheduled_ns"] is None  # the warm-up is a closed loop
    assert [r["status"] for r in measured] == ["ok"] * 6
    measured.sort(key=lambda r: r["index"])
    start = measured[0]["scheduled_ns"]
    # the trace's times (ms) over the speedup, exactly, from the level's start
    assert [r["scheduled_ns"] - start for r in measured] == [0, 0, 62_500_000, 312_500_000, 687_500_000, 750_000_000]
    for r in measured:
        assert r["decided_ns"] == r["scheduled_ns"] <= r["sent_ns"] <= r["chunk_ns"][0]
        assert r["expected_output_len"] == r["completion_tokens_server"]
    assert [r["prompt_tokens_server"] for r in measured] == [1100, 700, 1500, 600, 300, 1024]
    lv = out.summary["levels"][0]
    assert lv["label"] == "trace mooncake x4" and lv["offered_request_rate"] == pytest.approx(5 / 0.75)
    assert out.summary["trace"]["requests"] == 6 and out.summary["trace"]["cut"] is None
    assert out.summary["trace"]["expected_prefix_reuse"] == pytest.approx(2236 / 5224, abs=1e-6)  # test_traces.py
    assert not any("cut" in n for n in notes)


def test_a_trace_longer_than_the_budget_is_cut_with_a_note(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    notes = []
    out = replay(srv.url, tmp_path, notes, dataset="burstgpt", dataset_path=str(DATA / "burstgpt.csv"),
                 trace_speedup=1000.0, num_requests=3)
    assert out.summary["levels"][0]["completed"] == 3
    cut = out.summary["trace"]["cut"]
    assert cut == "trace cut to its first 3 of 4 requests by --num-requests 3: 0.1 s of its 0.1 s replayed"
    assert f"{DATA / 'burstgpt.csv'}: {cut}" in notes
    assert f"{DATA / 'burstgpt.csv'}: 1 row(s) left out (no response tokens)" in notes


def test_a_bad_trace_sends_nothing(tmp_path):
    bad = tmp_path / "bad.jsonl"
    shutil.copy(DATA / "mooncake.jsonl", bad)
    with bad.open("a") as f:
        f.write('{"timestamp": 3100, "input_length": 10, "hash_ids": [1]}\n')
    out = tmp_path / "out"
    # nothing listens on the port: a run that sent anything would fail on the server, not on the trace
    with pytest.raises(RooftopError, match=r"bad.jsonl, line 7, field 'output_length' is missing"):
        replay("http://127.0.0.1:9", out, [], dataset="mooncake", dataset_path=str(bad))
    assert not out.exists()
