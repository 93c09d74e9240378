"""The traffic flags of `rooftop bench` (arrivals, trace replay, multi-turn) map onto BenchSettings and are
checked by its rules before any request: a bad one is one error naming the flag and a value that works."""

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rooftop.cli import bench
from rooftop.errors import RooftopError
from rooftop.spec.bench import KEYS, BenchSettings

TRACE = str(Path(__file__).resolve().parents[1] / "data" / "traces" / "rooftop.jsonl")

BAD = [
    (["--request-rate", "4", "--burstiness", "0"], "--burstiness 0: burstiness is the gamma shape",
     "--burstiness 0.5"),
    (["--burstiness", "0.5"], "--burstiness 0.5 shapes open-loop arrivals and has no effect without --request-rate",
     "--request-rate 4"),
    (["--ramp-up-strategy", "linear", "--ramp-up-end-rps", "10"], "--ramp-up-start-rps: --ramp-up-strategy linear "
     "needs a positive, finite rate", "--ramp-up-start-rps 1 --ramp-up-end-rps 10"),
    (["--ramp-up-strategy", "cubic", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "10"],
     "--ramp-up-strategy cubic is not a ramp-up strategy", "linear, exponential"),
    (["--ramp-up-start-rps", "1"], "--ramp-up-start-rps has no effect without --ramp-up-strategy",
     "--ramp-up-strategy linear"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "10", "--request-rate", "4"],
     "--request-rate 4 and --ramp-up-strategy were both given", "drop --request-rate"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "10", "--duration", "5"],
     "--ramp-up-strategy linear moves the rate over the level's requests", "--num-requests 200"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "10", "--concurrency", "4"],
     "--concurrency 4 has no effect: --ramp-up-strategy sends", "--max-concurrency"),
    (["--dataset", "mooncake"], "--dataset mooncake needs --dataset-path", "Mooncake trace"),
    (["--dataset", "azure", "--dataset-path", "/nonexistent.csv"], "--dataset-path '/nonexistent.csv' is not a file",
     "Azure"),
    (["--dataset", "trace", "--dataset-path", TRACE, "--concurrency", "8"], "--concurrency 8 has no effect: "
     "--dataset trace replays", "--max-concurrency"),
    (["--dataset", "trace", "--dataset-path", TRACE, "--request-rate", "8"], "--request-rate has no effect with "
     "--dataset trace", "--trace-speedup"),
    (["--dataset", "trace", "--dataset-path", TRACE, "--trace-speedup", "0"], "--trace-speedup 0: a speedup",
     "--trace-speedup 2"),
    (["--dataset", "trace", "--dataset-path", TRACE, "--trace-window", "60:10"], "--trace-window 60:10: a window",
     "--trace-window 0:600"),
    (["--trace-window", "0:60"], "--trace-window has no effect with --dataset random", "--dataset mooncake"),
    (["--dataset", "conversation", "--turns", "0"], "--turns 0: a session needs at least 1", "--turns 4"),
    (["--dataset", "conversation", "--think-time", "-1"], "--think-time -1: the time between", "--think-time 1"),
    (["--multi-turn"], "--multi-turn reads ShareGPT's conversations", "--dataset conversation"),
]


def invoke(*args):
    app = typer.Typer()
    app.command()(bench.command)
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("args,problem,fix", BAD)
def test_a_bad_traffic_flag_is_refused_before_any_request(args, problem, fix):
    with pytest.raises(RooftopError) as err:  # port 9 (discard): nothing listens, and nothing is tried
        invoke("--port", 9, "--no-telemetry", *args)
    assert err.value.problem.startswith(problem), err.value.problem
    assert fix in err.value.fix, err.value.fix


@pytest.mark.parametrize("text", ["5", "a:b", "5-10"])
def test_a_trace_window_that_is_not_start_end(text):
    with pytest.raises(RooftopError, match="--trace-window .* is not START:END"):
        invoke("--port", 9, "--no-telemetry", "--dataset", "trace", "--dataset-path", TRACE, "--trace-window", text)


def test_the_same_rules_speak_a_campaigns_keys():
    with pytest.raises(RooftopError, match=r"^0: a speedup"):
        BenchSettings(dataset="trace", dataset_path="t.jsonl", trace_speedup=0.0).check(KEYS)
    with pytest.raises(RooftopError, match=r"^\[60, 10\]: a window .* trace_window_s = \[0, 600\]"):
        BenchSettings(dataset="trace", dataset_path="t.jsonl", trace_window_s=(60.0, 10.0)).check(KEYS)


def test_a_replay_through_the_command(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    done = invoke("--base-url", srv.url, "--no-telemetry", "--dataset", "trace", "--dataset-path", TRACE,
                  "--trace-window", "0.1:", "--trace-speedup", "10", "--warmup", "0", "--json", "--out", tmp_path)
    summary = json.loads(done.stdout)
    assert summary["trace"]["requests"] == 3 and summary["trace"]["window_s"] == [0.1, float("inf")]
    lv = summary["levels"][0]
    assert lv["label"] == "trace trace x10" and lv["completed"] == 3
    recs = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    start = min(r["scheduled_ns"] for r in recs)
    assert sorted(r["scheduled_ns"] - start for r in recs) == [0, 17_950_000, 18_950_000]
    # the trace's own prompt is sent as is
    assert sorted(r["prompt_tokens_server"] for r in recs) == sorted([600, len("Say hello in three words."), 530])
