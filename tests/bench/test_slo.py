"""Goodput and SLO capacity: the SLO's parsing, which requests meet it, the capacity rule and its
interval, and `rooftop bench --goodput` against real servers (the synthetic one, the embedded engine)."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rooftop.bench.loadgen import LevelPlan, LevelRun
from rooftop.bench.records import RequestRecord
from rooftop.bench.slo import (
    Slo,
    capacity,
    capacity_doc,
    describe_capacity,
    level_decision,
    meets,
    parse_goodput,
    short,
)
from rooftop.bench.summary import _share, build_summary
from rooftop.bench.sweep import BenchConfig, run_bench
from rooftop.campaign.verdicts import capacity_change
from rooftop.cli import _spread_goodput
from rooftop.errors import RooftopError

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))

from engine_server import start_engine  # noqa: E402


def test_goodput_is_spelled_as_vllm_bench_serve_spells_it():
    assert parse_goodput(["ttft:500", "tpot:50"]) == Slo(ttft_ms=500, tpot_ms=50, attainment=0.9)
    assert parse_goodput(["e2el:2000,ttft:1.5"], 0.5) == Slo(ttft_ms=1.5, e2el_ms=2000, attainment=0.5)
    # several values after one flag, as vLLM's argparse takes them, become a repeated typer option
    assert _spread_goodput(["bench", "--goodput", "ttft:500", "tpot:50", "--repeats", "3"]) == \
        ["bench", "--goodput", "ttft:500", "--goodput", "tpot:50", "--repeats", "3"]
    assert Slo(ttft_ms=500, tpot_ms=50).describe() == "TTFT ≤ 500 ms, TPOT ≤ 50 ms for 90% of requests"
    # a target with decimals keeps them: 95.5% is not "96%"
    assert Slo(ttft_ms=500, attainment=0.955).describe() == "TTFT ≤ 500 ms for 95.5% of requests"


@pytest.mark.parametrize(("items", "attainment", "says"), [
    (["ttft=500"], 0.9, "is not KEY:MS"),
    (["itl:5"], 0.9, "is not KEY:MS"),
    (["ttft:-1"], 0.9, "positive number of ms"),
    (["ttft:fast"], 0.9, "positive number of ms"),
    (["ttft:5", "ttft:6"], 0.9, "names ttft twice"),
    (["ttft:5"], 1.5, "--slo-attainment 1.5"),
])
def test_a_bad_slo_is_one_clear_error(items, attainment, says):
    with pytest.raises(RooftopError, match=says):
        parse_goodput(items, attainment)


def record(ttft_ms: float, gap_ms: float, tokens: int, ok: bool = True) -> RequestRecord:
    """A finished request decided at t=0: first token at ttft_ms, then one every gap_ms."""
    ns = 1_000_000
    chunks = [int((ttft_ms + i * gap_ms) * ns) for i in range(tokens)]
    return RequestRecord(index=0, concurrency=1, request_rate=None, repeat=0, warmup=False, decided_ns=0, sent_ns=0,
                         chunk_ns=chunks, end_ns=chunks[-1] if chunks else None,
                         status="ok" if ok else "error", completion_tokens_server=tokens)


def test_a_request_meets_the_slo_when_it_succeeded_within_every_bound():
    slo = Slo(ttft_ms=100, tpot_ms=20, e2el_ms=1000)
    assert meets(record(100, 20, 10), slo)  # on every bound: TTFT 100, TPOT 20, E2E 280
    assert not meets(record(100.5, 20, 10), slo)
    assert not meets(record(50, 20.5, 10), slo)
    assert not meets(record(50, 20, 50), slo)  # E2E 1030 ms
    assert not meets(record(50, 10, 10, ok=False), slo)  # a failed request never meets it
    assert meets(record(50, 0, 1), Slo(tpot_ms=1))  # one token has no TPOT, which cannot miss its bound


def test_capacity_is_the_highest_level_met_from_the_bottom_with_its_interval():
    levels = [1, 2, 4, 8, 16]
    clear = [[1.0, 1.0, 1.0], [0.97, 0.98, 0.99], [0.95, 0.96, 0.94], [0.5, 0.4, 0.6], [0.1, 0.0, 0.2]]
    c = capacity(levels, clear, 0.9)
    assert (c.load, c.low, c.high, c.reached, c.next_tested) == (4, 4, 4, True, 8)
    # a level near the target: its repeats straddle 90%, so the interval spans it and the next
    near = [[1.0, 1.0, 1.0], [0.99, 0.97, 0.98], [0.86, 0.95, 0.94], [0.5, 0.4, 0.6], [0.1, 0.0, 0.2]]
    c = capacity(levels, near, 0.9)
    assert c.load == 4 and c.low == 2 and c.high == 4
    # a dip below the target ends the capacity there, even if a higher level meets it again
    assert capacity(levels, [[1.0] * 3, [0.5] * 3, [1.0] * 3, [1.0] * 3, [1.0] * 3], 0.9).load == 1
    met = capacity(levels, [[1.0] * 3] * 5, 0.9)
    assert (met.load, met.reached, met.high) == (16, False, None)  # at least 16: a bound, not a figure
    none = capacity(levels, [[0.2] * 3] * 5, 0.9)
    assert (none.load, none.low) == (None, None)
    single = capacity([1, 2], [[1.0], [0.0]], 0.9)
    assert (single.load, single.low, single.high) == (1, None, None) and single.method.startswith("single")


def test_the_capacity_sentence_says_what_kind_of_figure_it_is():
    slo = Slo(ttft_ms=500)
    levels = [1, 2, 4, 8, 16]
    near = capacity(levels, [[1.0] * 3, [0.99, 0.97, 0.98], [0.86, 0.95, 0.94], [0.5] * 3, [0.0] * 3], 0.9)
    assert describe_capacity(near, slo).startswith(
        "SLO capacity C=4 [2, 4]: TTFT ≤ 500 ms for 90% of requests; between the levels tested it lies in [4, 8)")
    met = capacity(levels, [[1.0] * 3] * 5, 0.9)
    assert describe_capacity(met, slo).startswith(
        "SLO capacity at least C=16 [16, not reached], the highest level tested (not reached)")
    none = capacity(levels, [[0.0] * 3] * 5, 0.9, kind="request_rate")
    assert describe_capacity(none, slo).startswith(
        "SLO capacity below 1 req/s [<1, <1]: even the lowest level tested missed")


def test_the_interval_is_said_when_the_capacity_sits_at_an_edge_of_the_levels():
    slo = Slo(ttft_ms=500)
    # the lowest level misses on its mean, but its interval reaches 90%: the capacity may be C=1
    low = capacity([1, 8, 16], [[0.95, 0.85, 0.84], [0.5] * 3, [0.1] * 3], 0.9)
    assert (low.load, low.low, low.high) == (None, None, 1)
    assert short(low.to_dict()) == "below C=1 [<1, 1]"
    assert describe_capacity(low, slo).startswith("SLO capacity below C=1 [<1, 1]: even the lowest level")
    # the top level meets on its mean, but its interval reaches below 90%: the capacity may be C=8
    top = capacity([1, 8, 16], [[1.0] * 3, [0.95] * 3, [0.99, 0.97, 0.80]], 0.9)
    assert (top.load, top.low, top.high, top.high_open) == (16, 8, None, True)
    assert short(top.to_dict()) == "C=16 or more [8, not reached]"
    assert describe_capacity(top, slo).startswith("SLO capacity at least C=16 [8, not reached], the highest")


def test_capacity_decisions_follow_each_levels_attainment_interval():
    """Three repeats each a little above 90% at C=8: the level's own attainment interval (the one its
    row shows) reaches below 90%, so the capacity's interval reaches down to C=1 too; a lever whose C=8
    sits a little below 90% is then no different within noise, not lower."""
    att = [[1.0, 1.0, 1.0], [0.92, 0.95, 0.91], [0.3, 0.4, 0.35]]
    row = _share(att[1], 0.95, 0)
    assert row["ci_low"] < 0.9 < row["mean"]
    assert [level_decision(a, 0.9) for a in att] == ["met", "undecided", "missed"]
    base = capacity_doc([1, 8, 16], att, Slo(ttft_ms=500))
    assert (base["load"], base["low"], base["high"]) == (8, 1, 8)
    lever = capacity_doc([1, 8, 16], [att[0], [0.88, 0.89, 0.87], att[2]], Slo(ttft_ms=500))
    assert (lever["load"], lever["low"], lever["high"]) == (1, 1, 8)
    assert capacity_change(base, lever) == "no difference within noise"


def _records(n_ok: int, n_failed: int) -> list[RequestRecord]:
    out = [record(100, 10, 5) for _ in range(n_ok)]
    out += [record(100, 10, 5, ok=False) for _ in range(n_failed)]
    for i, r in enumerate(out):
        r.index = i
    return out


def test_a_level_the_server_stopped_answering_in_is_a_miss_named_in_the_sentence():
    """C=1 and C=16 ran whole; at C=32 the server went away after 3 of its 16 planned requests, all 3 met
    the SLO. Its attainment is 3/16, and the capacity is C=16, not 'not reached at C=16'."""
    slo = Slo(ttft_ms=500)
    runs = []
    for c in (1, 16):
        runs += [LevelRun(LevelPlan(concurrency=c, num_requests=16), r, _records(16, 0), 0, 10**9, 10**9)
                 for r in range(3)]
    runs.append(LevelRun(LevelPlan(concurrency=32, num_requests=16), 0, _records(3, 0), 0, 10**9, 10**9,
                         aborted="server gone"))
    doc = build_summary(runs, meta={}, confidence=0.95, seed=0, forced_length=False, planned_repeats=3,
                        aborted="the server stopped answering", slo=slo)
    top = doc["levels"][-1]
    assert top["stopped_early"] and top["slo_attainment"]["per_repeat"] == [0.1875]
    cap = doc["slo_capacity"]
    assert (cap["load"], cap["low"], cap["high"], cap["reached"], cap["stopped"]) == (16, 16, 16, True, [32])
    assert cap["sentence"].startswith("SLO capacity C=16 [16, 16]: TTFT ≤ 500 ms for 90% of requests; between "
                                      "the levels tested it lies in [16, 32); C=32 stopped early (the server "
                                      "stopped answering) and counts as a miss")


def bench(url: str, tmp_path, slo: Slo, **kw):
    cfg = BenchConfig(base_url=url, input_len=16, output_len=6, num_requests=10, warmup=2, out_dir=tmp_path,
                      slo=slo, **kw)
    return asyncio.run(run_bench(cfg)).summary


def test_goodput_equals_request_throughput_when_every_request_meets_the_slo_and_0_when_none_can(
        fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "20", "--itl-ms", "2")
    easy = bench(srv.url, tmp_path / "easy", Slo(ttft_ms=60_000, tpot_ms=60_000, e2el_ms=60_000),
                 concurrency=[1, 4], repeats=2)
    for lv in easy["levels"]:
        assert lv["slo_met"] == lv["completed"] == 20
        assert lv["goodput_req_s"]["per_repeat"] == lv["request_s"]["per_repeat"]
        assert lv["slo_attainment"]["per_repeat"] == [1.0, 1.0]
    assert easy["slo_capacity"]["load"] == 4 and not easy["slo_capacity"]["reached"]
    # the server takes 20 ms to a first token: a 5 ms TTFT bound cannot be met
    none = bench(srv.url, tmp_path / "none", Slo(ttft_ms=5), concurrency=[1, 4], repeats=2)
    for lv in none["levels"]:
        assert lv["slo_met"] == 0 and lv["goodput_req_s"]["per_repeat"] == [0.0, 0.0]
        assert lv["completed"] == 20  # the requests succeeded; they only missed the bound
    assert none["slo_capacity"]["load"] is None
    assert "below C=1" in none["slo_capacity"]["sentence"]
    assert json.loads((tmp_path / "none" / "summary.json").read_text())["slo"]["ttft_ms"] == 5


def test_cli_goodput_in_vllms_spelling_prints_the_columns_and_the_capacity(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "10", "--itl-ms", "1")
    out = subprocess.run(
        [sys.executable, "-m", "rooftop", "bench", "--base-url", srv.url, "--concurrency", "1,2",
         "--num-requests", "6", "--input-len", "8", "--output-len", "4", "--warmup", "1",
         "--goodput", "ttft:60000", "tpot:60000", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "goodput req/s" in out.stdout and "100%" in out.stdout
    assert "SLO capacity at least C=2, the highest level tested (not reached): TTFT ≤ 60000 ms, TPOT ≤ 60000 ms" \
        in " ".join(out.stdout.split())


def test_slo_capacity_on_the_embedded_engines_sweep(tmp_path):
    """The embedded engine (tiny, CPU) swept at C=1,2,4 with 3 repeats: the per-repeat attainment is
    what the records say, and the capacity and its interval are what the rule gives on it."""
    srv = start_engine()
    try:
        slo = Slo(ttft_ms=60_000, tpot_ms=60_000)  # met by every request, whatever this machine's speed
        summary = bench(srv.url, tmp_path, slo, concurrency=[1, 2, 4], repeats=3)
    finally:
        srv.stop()
    lines = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    measured = [x for x in lines if not x["warmup"]]
    for lv in summary["levels"]:
        assert lv["valid"], lv["invalid_reason"]
        for repeat, share in enumerate(lv["slo_attainment"]["per_repeat"]):
            recs = [x for x in measured if x["concurrency"] == lv["concurrency"] and x["repeat"] == repeat]
            ok = [x for x in recs if x["status"] == "ok" and x["chunk_ns"]]
            assert share == pytest.approx(len(ok) / len(recs)) == 1.0
    cap = summary["slo_capacity"]
    assert (cap["load"], cap["low"], cap["high"], cap["reached"], cap["high_open"]) == (4, 4, None, False, True)
    assert cap["method"] == "each level's 95% attainment interval across repeats"
    assert cap["sentence"].startswith("SLO capacity at least C=4 [4, not reached], the highest level tested")


def test_without_a_stream_tpot_is_undefined_and_a_tpot_bound_is_refused(fake_server, tmp_path):
    """--no-stream: each answer arrives whole, so no time between its tokens is known. TPOT and ITL are
    not reported (they read 0 before, and every request met any TPOT bound); TTFT is the whole answer's."""
    srv = fake_server("--ttft-ms", "5", "--itl-ms", "20")
    summary = bench(srv.url, tmp_path / "whole", Slo(e2el_ms=60_000), concurrency=[1], stream=False)
    lv = summary["levels"][0]
    assert lv["completed"] == 10 and lv["slo_met"] == 10
    assert lv["tpot_ms"]["n"] == 0 and lv["tpot_ms"]["mean"] is None and lv["itl_ms"]["n"] == 0
    assert lv["ttft_ms"]["median"] == pytest.approx(lv["e2e_ms"]["median"], rel=1e-9)
    assert lv["ttft_ms"]["median"] >= 5 + 5 * 20  # 6 tokens, the first after 5 ms, then one every 20 ms
    # a TPOT bound cannot be judged on such answers: none meets it
    lines = [json.loads(x) for x in (tmp_path / "whole" / "requests.jsonl").read_text().splitlines()]
    rec = RequestRecord(**{k: v for k, v in lines[-1].items() if k in RequestRecord.__slots__})
    assert rec.streamed is False and not meets(rec, Slo(tpot_ms=1e9))


@pytest.mark.parametrize(("flags", "says"), [
    (["--goodput", "tpot:50", "--no-stream"], "--goodput tpot: cannot be judged with --no-stream"),
    (["--slo-attainment", "0.8"], "--slo-attainment has no effect without --goodput"),
    (["--no-telemetry", "--gpus", "0"], "--gpus has no effect with --no-telemetry"),
    (["--no-telemetry", "--dcgm-url", "http://h:9400/metrics"], "--dcgm-url has no effect with --no-telemetry"),
    (["--dcgm-url", "dcgm-host/metrics"], "--dcgm-url 'dcgm-host/metrics' needs http:// or https:// before the host"),
    (["--dcgm-url", "http://[::1"], "--dcgm-url 'http://[::1' not a URL"),
    (["--dcgm-url", "http:///metrics"], "--dcgm-url 'http:///metrics' names no host"),
])
def test_flags_that_cannot_take_effect_are_one_clear_error(flags, says):
    out = subprocess.run([sys.executable, "-m", "rooftop", "bench", "--base-url", "http://127.0.0.1:9", *flags],
                         capture_output=True, text=True, timeout=60, env={"COLUMNS": "300", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2 and says in " ".join(out.stderr.split()) and "Traceback" not in out.stderr
