"""A level's load and its bounds: the open loop judged against the schedule it drew, a duration that
bounds count and time, stragglers cut at the level's deadline, and which failures stop a sweep."""

import asyncio
import errno

from rooftop.bench import client
from rooftop.bench.loadgen import LevelPlan, LevelRun, arrival_offsets_ns, level_deadline_ns, split_level
from rooftop.bench.records import RequestRecord
from rooftop.bench.summary import build_summary, level_summary
from rooftop.bench.sweep import BenchConfig, run_bench
from rooftop.spec.campaign import BenchSection, WorkloadSection, settings_of


def _kept(rate: float, n: int, seed: int, lag_ns: int = 0, stretch: float = 1.0) -> LevelRun:
    """A level-run whose requests went out `lag_ns` after their scheduled arrival, spread `stretch` times."""
    arrivals = arrival_offsets_ns(rate, n, seed)
    recs = []
    for i, t in enumerate(arrivals):
        r = RequestRecord(index=i, concurrency=None, request_rate=rate, repeat=0, warmup=False, decided_ns=t,
                          sent_ns=int(t * stretch) + lag_ns, status="ok", chunk_ns=[int(t * stretch) + lag_ns + 1000],
                          end_ns=int(t * stretch) + lag_ns + 2000, chunk_tokens=[1])
        recs.append(r)
    return LevelRun(LevelPlan(request_rate=rate, num_requests=n), 0, recs, 0, recs[-1].end_ns, arrivals[-1])


def test_a_schedule_kept_is_no_shortfall_however_the_draw_fell():
    # Seed 0 at 4/s, 64 arrivals: the draw runs more than 10% slower than 4/s by chance.
    arrivals = arrival_offsets_ns(4.0, 64, 0)
    realised = 63 / (arrivals[-1] / 1e9)
    assert realised < 4.0 * 0.9
    lv = level_summary([_kept(4.0, 64, 0)], confidence=0.95, seed=0, forced_length=False, planned_repeats=1)
    assert lv["offered_request_rate"] == 4.0 and lv["scheduled_request_rate"] == round(realised, 4)
    assert lv["achieved_request_rate"] == round(realised, 4) and not lv["load_shortfall"]
    assert lv["send_lag_ms_max"] == 0.0
    # The same draw sent 30% slower than scheduled (a cap, a late loop) falls short.
    late = level_summary([_kept(4.0, 64, 0, stretch=1.3)], confidence=0.95, seed=0, forced_length=False,
                         planned_repeats=1)
    assert late["load_shortfall"] and late["scheduled_request_rate"] == round(realised, 4)


def test_each_level_draws_its_own_arrivals(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "1", "--itl-ms", "1")
    cfg = BenchConfig(base_url=srv.url, input_len=16, output_len=2, request_rate=[100.0, 200.0], num_requests=8,
                      concurrency=[], warmup=0, out_dir=tmp_path, telemetry=False)
    out = asyncio.run(run_bench(cfg))
    gaps = {}
    for rate in (100.0, 200.0):
        d = sorted(r.decided_ns for r in out.records if r.request_rate == rate)
        gaps[rate] = [round((b - a) * rate / 1e6) for a, b in zip(d, d[1:], strict=False)]
    assert gaps[100.0] != gaps[200.0]  # one draw scaled to each rate would give the same normalised gaps


def test_a_duration_without_a_count_is_bounded_by_time_alone(fake_server, tmp_path):
    # a campaign's [bench] with a duration passes no count on; without one, 64 a level
    assert settings_of(WorkloadSection(), BenchSection(duration_s=60)).num_requests is None
    assert settings_of(WorkloadSection(), BenchSection()).num_requests == 64
    srv = fake_server("--ttft-ms", "1", "--itl-ms", "1")
    cfg = BenchConfig(base_url=srv.url, input_len=16, output_len=2, concurrency=[2], num_requests=None,
                      duration_s=1.0, warmup=0, out_dir=tmp_path, telemetry=False)
    out = asyncio.run(run_bench(cfg))
    recs = [r for r in out.records if not r.warmup]
    assert len(recs) > 64 and all(r.ok for r in recs)  # past the old default count
    assert sorted(r.index for r in recs) == list(range(len(recs)))
    lv = out.summary["levels"][0]
    assert lv["valid"] and lv["completed"] == len(recs) and lv["cut_off"] == 0


def test_unbounded_closed_loop_shares_cycle_a_pool_of_prompts():
    shares = split_level(LevelPlan(concurrency=3, num_requests=None, duration_s=5), ["a", "b"], seed=0, procs=2)
    assert [s.users for s in shares] == [2, 1]
    assert [list(s.indices[:3]) for s in shares] == [[0, 2, 4], [1, 3, 5]]
    assert [s.prompts[:3] for s in shares] == [["a", "a", "a"], ["b", "b", "b"]]


def test_an_open_loop_stops_at_its_duration_not_at_its_next_arrival(fake_server, tmp_path):
    arrivals = arrival_offsets_ns(0.2, 10, 0)
    assert arrivals[1] > 3e9  # the second request is due well after the 1 s duration
    srv = fake_server("--ttft-ms", "1", "--itl-ms", "1")
    cfg = BenchConfig(base_url=srv.url, input_len=16, output_len=2, request_rate=[0.2], concurrency=[],
                      num_requests=10, duration_s=1.0, warmup=0, out_dir=tmp_path, telemetry=False)
    out = asyncio.run(run_bench(cfg))
    (run,) = out.level_runs
    assert len(run.records) == 1
    # The level lasts its duration, not until the next arrival, and its rates are over that duration.
    assert 1e9 <= run.end_ns - run.start_ns < arrivals[1]
    lv = out.summary["levels"][0]
    assert lv["request_s"]["mean"] == round(1 / ((run.end_ns - run.start_ns) / 1e9), 4)


def test_requests_past_the_levels_deadline_are_cut_not_failed(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "30000", "--itl-ms", "1")  # no answer for 30 s
    cfg = BenchConfig(base_url=srv.url, input_len=16, output_len=2, concurrency=[2], num_requests=None,
                      duration_s=0.3, grace_s=0.2, warmup=0, timeout_s=120, out_dir=tmp_path, telemetry=False)
    out = asyncio.run(run_bench(cfg))
    (run,) = out.level_runs
    assert len(run.records) == 2 and all(r.error_class == "cut_off" for r in run.records)
    assert out.aborted is None and out.summary["complete"]
    # The level's wall time ends at its deadline (duration plus grace), not when a straggler would have.
    (share,) = split_level(run.plan, ["p"], 0, 1)
    assert run.end_ns <= level_deadline_ns(run.plan, share, run.start_ns, cfg.timeout_s) == run.start_ns + 500_000_000
    lv = out.summary["levels"][0]
    assert (lv["failed"], lv["cut_off"], lv["completed"], lv["error_classes"]) == (0, 2, 0, {})
    assert not lv["valid"] and "no request completed" in lv["invalid_reason"]


def test_a_counted_level_has_a_deadline_from_the_timeout():
    plan = LevelPlan(concurrency=4, num_requests=10)
    (share,) = split_level(plan, ["p"], 0, 1)
    assert level_deadline_ns(plan, share, 0, 60.0) == int((3 * 60.0 + 10.0) * 1e9)  # 3 waves of 4 users


def test_one_dropped_connection_fails_its_request_and_the_sweep_goes_on(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "1", "--itl-ms", "1", "--drop", "3")
    cfg = BenchConfig(base_url=srv.url, input_len=16, output_len=4, concurrency=[2, 4], num_requests=8, warmup=0,
                      out_dir=tmp_path, telemetry=False)
    out = asyncio.run(run_bench(cfg))
    assert out.aborted is None and out.summary["complete"]
    levels = {lv["label"]: lv for lv in out.summary["levels"]}
    assert set(levels) == {"C=2", "C=4"}
    assert (levels["C=2"]["completed"], levels["C=2"]["error_classes"]) == (7, {"server_disconnected": 1})
    assert levels["C=4"]["valid"] and levels["C=4"]["completed"] == 8


class _NoFiles:
    async def request(self, *a, **kw):
        raise OSError(errno.EMFILE, "Too many open files")


def test_out_of_file_descriptors_is_the_clients_error_with_a_hint():
    rec = RequestRecord(index=0, concurrency=1, request_rate=None, repeat=0, warmup=False, decided_ns=0)
    prepared = client.prepare(client.build_payload(chat=False, model="m", prompt="p", max_tokens=2, stream=True,
                                                   force_length=True))
    asyncio.run(client.send(_NoFiles(), "http://127.0.0.1:9/v1/completions", prepared, rec, 5.0))
    assert rec.error_class == "client_error" and "ulimit -n" in rec.error
    lv = level_summary([LevelRun(LevelPlan(concurrency=1, num_requests=1), 0, [rec], 0, 10**9, 0)],
                       confidence=0.95, seed=0, forced_length=True, planned_repeats=1)
    assert "ulimit -n" in lv["invalid_reason"]


def test_output_length_is_checked_by_the_client_without_usage(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "1", "--itl-ms", "1", "--no-usage", "--stop-after", "3")
    cfg = BenchConfig(base_url=srv.url, input_len=16, output_len=8, concurrency=[1], num_requests=4, warmup=0,
                      out_dir=tmp_path, telemetry=False)
    tc = asyncio.run(run_bench(cfg)).summary["levels"][0]["token_check"]
    assert (tc["no_usage"], tc["output_len_mismatch"]) == (4, 4)
    assert tc["examples"][0]["requested_output"] == 8 and tc["examples"][0]["client_output"] == 3


def test_latency_intervals_keep_their_keys_without_samples_and_say_single_from_one_repeat():
    rec = RequestRecord(index=0, concurrency=1, request_rate=None, repeat=0, warmup=False, decided_ns=0,
                        sent_ns=0, chunk_ns=[5_000_000], chunk_tokens=[1], end_ns=5_000_000, status="ok")
    doc = build_summary([LevelRun(LevelPlan(concurrency=1, num_requests=1), 0, [rec], 0, 10**9, 0)], meta={},
                        confidence=0.95, seed=0, forced_length=False, planned_repeats=1, aborted=None)
    lv = doc["levels"][0]
    assert lv["ttft_ms"]["ci_low"] == lv["ttft_ms"]["ci_high"] == 5.0 and lv["ttft_ms"]["ci_method"] == "single"
    t = lv["tpot_ms"]  # one token: no TPOT at all
    assert t["n"] == 0 and (t["ci_low"], t["ci_high"], t["ci_method"]) == (None, None, "empty")


def test_requests_waiting_for_a_caps_slot_at_the_deadline_are_cut_too(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "30000", "--itl-ms", "1")
    cfg = BenchConfig(base_url=srv.url, input_len=16, output_len=2, request_rate=[50.0], max_concurrency=1,
                      concurrency=[], num_requests=None, duration_s=0.3, grace_s=0.2, warmup=0, timeout_s=120,
                      out_dir=tmp_path, telemetry=False)
    (run,) = asyncio.run(run_bench(cfg)).level_runs
    assert len(run.records) > 1 and all(r.error_class == "cut_off" and r.end_ns for r in run.records)
    assert sum(r.sent_ns is not None for r in run.records) == 1  # one in the slot, the rest never sent
