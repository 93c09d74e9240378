"""rooftop bench against the synthetic server: records, figures, failures, token-count checks."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from itertools import pairwise

from rooftop.bench.records import SERVER_GONE
from rooftop.bench.sweep import BenchConfig, run_bench


def most_in_flight(recs: list[dict]) -> int:
    """The most requests between their send and their end at one time."""
    edges = sorted([(r["sent_ns"], 1) for r in recs] + [(r["end_ns"], -1) for r in recs])  # an end first on a tie
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def bench(url: str, tmp_path, **kw):
    cfg = BenchConfig(base_url=url, input_len=24, output_len=8, num_requests=12, warmup=2, out_dir=tmp_path, **kw)
    return asyncio.run(run_bench(cfg))


def test_closed_loop_sweep_records_every_request(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "5", "--itl-ms", "2")
    out = bench(srv.url, tmp_path, concurrency=[1, 4], repeats=2)
    lines = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    measured = [x for x in lines if not x["warmup"]]
    assert len(measured) == 2 * 2 * 12 and sum(x["warmup"] for x in lines) == 2
    assert all(x["status"] == "ok" for x in lines)
    for x in measured:
        assert x["completion_tokens_server"] == 8 == len(x["chunk_ns"]) == x["completion_tokens_client"]
        assert x["prompt_tokens_server"] == 24 == x["prompt_tokens_client"]
        # Latency starts at the decision: it can never be shorter than what the server spent.
        assert x["chunk_ns"][0] - x["decided_ns"] >= x["server_sent_ns"][0] - x["server_received_ns"]
        assert x["decided_ns"] <= x["sent_ns"] <= x["first_byte_ns"] <= x["chunk_ns"][0] <= x["end_ns"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    made = summary.pop("provenance")  # the file says what made it; the returned summary is the figures
    assert made["command"] and "commit" in made and "dirty" in made
    assert summary == out.summary and summary["complete"] and summary["model"] == "fake"
    levels = {lv["concurrency"]: lv for lv in summary["levels"]}
    assert set(levels) == {1, 4}
    for lv in levels.values():
        assert lv["valid"] and lv["completed"] == 24 and lv["failed"] == 0 and lv["repeats_run"] == 2
        o = lv["output_tok_s"]
        assert o["ci_low"] <= o["mean"] <= o["ci_high"] and len(o["per_repeat"]) == 2
        for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            assert {"mean", "median", "p90", "p99"} <= set(lv[m])
        assert "p99" in lv["ttft_ms"]["thin"]  # 24 samples cannot carry a p99
        assert lv["token_check"]["usage_vs_client_output"] == 0
    # Every user keeps one request in flight: one user's go out one after another, four users' overlap four
    # deep (each sends its first request before any answer can arrive).
    for concurrency in (1, 4):
        for repeat in (0, 1):
            recs = [x for x in measured if x["concurrency"] == concurrency and x["repeat"] == repeat]
            assert len(recs) == 12 and most_in_flight(recs) == concurrency, (concurrency, repeat)


def test_open_loop_with_a_cap_counts_waiting_for_a_slot(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "20", "--itl-ms", "5")
    out = bench(srv.url, tmp_path, request_rate=[200.0], max_concurrency=1)
    recs = [r for r in out.records if not r.warmup]
    assert len(recs) == 12 and all(r.ok for r in recs)
    # One slot: each request goes out only after the one before it ended.
    by_sent = sorted(recs, key=lambda r: r.sent_ns)
    assert all(b.sent_ns >= a.end_ns for a, b in pairwise(by_sent))
    # The seeded arrivals all fall in the first 60 ms, and the server takes at least 55 ms a request: every
    # request after the first was due before the one ahead of it ended, and its latency counts from then.
    assert all(b.decided_ns < a.end_ns for a, b in pairwise(by_sent))
    # 11 gaps of at least 55 ms between sends: at most 18 requests/s achieved of the 200 offered.
    lv = out.summary["levels"][0]
    assert lv["load_shortfall"] and lv["offered_request_rate"] == 200.0


def test_usage_disagreeing_with_the_client_is_reported(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "1", "--itl-ms", "1", "--usage-skew", "3")
    out = bench(srv.url, tmp_path, concurrency=[2])
    tc = out.summary["levels"][0]["token_check"]
    assert tc["usage_vs_client_output"] == 12 and tc["output_len_mismatch"] == 12
    ex = tc["examples"][0]
    assert ex["server_output"] == 11 and ex["client_output"] == 8 and ex["requested_output"] == 8
    # Not silently resolved: the record keeps both counts.
    r = next(r for r in out.records if not r.warmup)
    assert (r.completion_tokens_server, r.completion_tokens_client) == (11, 8)


def finished_lines(jsonl) -> list[dict]:
    """The records in requests.jsonl so far, less a line still being written."""
    text = jsonl.read_text() if jsonl.exists() else ""
    return [json.loads(line) for line in text.split("\n")[:-1]]


def test_killing_the_server_mid_run_loses_nothing(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "5", "--itl-ms", "20")
    out_dir = tmp_path / "run"
    # Repeats of 8 requests at C=4, each request at least 1 s by the server's schedule: a repeat's records
    # land in requests.jsonl as it ends, and the server is killed once the first has landed, during a later one.
    cmd = [sys.executable, "-m", "rooftop", "bench", "--base-url", srv.url, "--input-len", "16",
           "--output-len", "50", "--concurrency", "4", "--num-requests", "8", "--repeats", "50", "--warmup", "1",
           "--out", str(out_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    jsonl = out_dir / "requests.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sum(not x["warmup"] for x in finished_lines(jsonl)) < 8:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    os.killpg(srv.proc.pid, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert "stopped answering" in stderr and "Traceback" not in stderr
    measured = [x for x in finished_lines(jsonl) if not x["warmup"]]
    failed = [x for x in measured if x["status"] == "error"]
    assert failed and all(x["error_class"] in SERVER_GONE for x in failed), "the requests cut off are recorded"
    killed = max(x["repeat"] for x in measured)
    assert {x["repeat"] for x in failed} == {killed} and killed >= 1
    for repeat in range(killed):  # the repeats before the kill: whole, every request once and answered
        recs = [x for x in measured if x["repeat"] == repeat]
        assert sorted(x["index"] for x in recs) == list(range(8)) and all(x["status"] == "ok" for x in recs), repeat
    cut = [x for x in measured if x["repeat"] == killed]  # each request it sent, once
    assert all(x["status"] in ("ok", "error") for x in cut) and len({x["index"] for x in cut}) == len(cut) <= 8
    summary = json.loads((out_dir / "summary.json").read_text())
    lv = summary["levels"][0]
    assert not summary["complete"] and not lv["valid"] and "failed" in lv["invalid_reason"]
    assert lv["completed"] + lv["failed"] == len(measured) and lv["failed"] == len(failed)


def test_unreachable_server_is_one_clear_error(tmp_path):
    cmd = [sys.executable, "-m", "rooftop", "bench", "--base-url", "http://127.0.0.1:9", "--num-requests", "2"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "no OpenAI-compatible server answers at http://127.0.0.1:9" in p.stderr
    assert "Traceback" not in p.stderr


def test_a_request_past_its_timeout_is_recorded_as_one(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "5000", "--itl-ms", "1")  # no first token for 5 s
    cfg = BenchConfig(base_url=srv.url, input_len=24, output_len=8, num_requests=4, warmup=0, concurrency=[2],
                      timeout_s=0.3, out_dir=tmp_path)
    recs = [r for r in asyncio.run(run_bench(cfg)).records if not r.warmup]
    assert len(recs) == 4 and all(r.error_class == "timeout" and not r.chunk_ns for r in recs)
    assert all(r.end_ns - r.sent_ns >= 300_000_000 for r in recs)  # never before its time
    # The connection of a timed-out request is dropped: the next request on its user still goes out.
    assert sorted(r.index for r in recs) == [0, 1, 2, 3]
