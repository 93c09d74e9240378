"""A campaign's [bench] is checked when the campaign loads: what would fail only once the sweep ran,
after a deployment came up, is one message naming the key."""

import tomllib

import pytest
from pydantic import ValidationError

from rooftop.campaign.preflight import check_engines_installed
from rooftop.errors import RooftopError
from rooftop.spec.campaign import BenchSection, parse_campaign

BAD = {
    'dataset = "sharegpt"': "bench.dataset: 'sharegpt' needs dataset_path",
    'dataset = "prefix"': "bench.prefix_len: 0: dataset = 'prefix' shares a prefix of at least 1 token",
    'dataset = "prefix"\nprefix_len = 300\ninput_len = 256': "bench.prefix_len: 300: dataset = 'prefix' shares",
    "prefix_len = 64": "bench.prefix_len: 64 has no effect",
    "duration_s = inf": "bench.duration_s: inf: a level's duration must be a positive, finite number",
    "duration_s = nan": "bench.duration_s: nan: a level's duration must be a positive, finite number",
    "timeout_s = inf": "bench.timeout_s: inf: a request's timeout must be a positive, finite",
    "output_len = 0": "bench.output_len: 0: a request must generate at least one token",
}
HEAD = '[campaign]\nname = "t"\n[model]\npreset = "tiny"\n[deployment]\nengine = "embedded"\n'


@pytest.mark.parametrize("text", list(BAD))
def test_a_bench_that_cannot_run_is_refused_at_load(text):
    with pytest.raises(RooftopError) as err:
        parse_campaign(HEAD + "[bench]\n" + text, "c.toml")
    assert f"c.toml: {BAD[text]}" in str(err.value)


def test_good_benches_load():
    def settings(text: str):
        return parse_campaign(HEAD + "[bench]\n" + text).bench_settings()

    assert settings('dataset = "prefix"\nprefix_len = 128').prefix_len == 128
    assert settings('dataset = "sharegpt"\ndataset_path = "x.json"\noutput_len = 0').output_len == 0
    assert settings("duration_s = 30").num_requests is None
    assert settings("duration_s = 30\nrequests_per_level = 100").num_requests == 100
    assert settings("").num_requests == 64 and settings("").concurrency == [1, 8, 16]
    assert BenchSection.model_validate(tomllib.loads("concurrency = [8, 1, 8]")).concurrency == [1, 8]
    with pytest.raises(ValidationError, match="telemetry"):
        BenchSection.model_validate({"telemetry": "yes"})


CAMPAIGN = """
[campaign]
name = "t"
[model]
preset = "tiny"
[deployment]
engine = "embedded"
[bench]
dataset = "sharegpt"
dataset_path = "{path}"
"""


def test_a_missing_sharegpt_file_is_refused_when_a_run_starts(tmp_path):
    spec = parse_campaign(CAMPAIGN.format(path=tmp_path / "gone.json"), "c.toml")  # a stored campaign still reads
    with pytest.raises(RooftopError, match="c.toml: bench.dataset_path: '.*gone.json' is not a file"):
        check_engines_installed(spec, "c.toml")
    (tmp_path / "gone.json").write_text("[]")
    check_engines_installed(spec, "c.toml")


@pytest.mark.parametrize("bench,amount", [
    ("", "64 requests per level"),
    ("duration_s = 30", "30 s per level"),
    ("duration_s = 30\nrequests_per_level = 100", "30 s (at most 100 requests) per level"),
])
def test_plan_says_how_each_level_is_bounded(bench, amount):
    from rooftop.campaign.store import RunRow
    from rooftop.report.plan_md import constraints

    text = CAMPAIGN.replace('dataset = "sharegpt"\ndataset_path = "{path}"\n', bench + "\n")
    spec = parse_campaign(text, "c.toml")
    assert amount in constraints(spec, RunRow("t", "", "independent", text, None, "", {}))


WORKLOAD_BAD = {
    # BenchSettings' rules, worded as in `rooftop bench`, naming the table and key the problem starts with
    '[workload]\ndataset = "mooncake"\ndataset_path = "t.jsonl"\ntrace_speedup = 0\n[profile]\nconcurrency = 4':
        "workload.trace_speedup: 0: a speedup is a positive, finite factor",
    '[workload]\ndataset = "mooncake"\ndataset_path = "t.jsonl"\ntrace_window_s = [5, 2]\n[profile]\nconcurrency = 4':
        "workload.trace_window_s: [5, 2]: a window is START:END seconds of trace time",
    '[workload]\ndataset = "mooncake"\n[profile]\nconcurrency = 4':
        "workload.dataset: 'mooncake' needs dataset_path (point it at a Mooncake trace",
    '[workload]\ndataset = "mooncake"\ndataset_path = "t.jsonl"\n[bench]\nconcurrency = [4]':
        "bench.concurrency: [4] has no effect: dataset = 'mooncake' replays its requests at the trace's own times",
    '[workload]\ndataset = "mooncake"\ndataset_path = "t.jsonl"':
        "profile.concurrency: an open-loop workload (a trace, request rates, a ramp) has no concurrency level",
    "[workload]\nburstiness = 0.5":
        "workload.burstiness: 0.5 shapes open-loop arrivals and has no effect without request_rate",
    '[workload]\nramp_up_strategy = "linear"\nramp_up_start_rps = 1\n[profile]\nconcurrency = 4':
        "workload.ramp_up_end_rps: not given: ramp_up_strategy = 'linear' needs a positive, finite rate",
    "[workload]\nsessions = 0": "workload.sessions: 0: a session needs at least 1",
    "[workload]\ninput_len = 64\n[bench]\ninput_len = 32":
        "bench.input_len: is given in [workload] too: a campaign says what traffic once",
    "[workload]\nrequests_per_level = 8": "workload.requests_per_level: unknown key",
    "[bench]\ntrace_speedup = 2": "bench.trace_speedup: unknown key",
}


@pytest.mark.parametrize("text", list(WORKLOAD_BAD))
def test_a_workload_that_cannot_run_is_one_message_naming_its_table_and_key(text):
    with pytest.raises(RooftopError) as err:
        parse_campaign(HEAD + text, "c.toml")
    assert f"c.toml: {WORKLOAD_BAD[text]}" in str(err.value), str(err.value)


def test_the_workload_fills_the_settings_every_variants_sweep_runs():
    """[workload] says what traffic, [bench] how it is measured; open-loop workloads sweep no concurrency."""
    spec = parse_campaign(HEAD + '[workload]\ndataset = "mooncake"\ndataset_path = "t.jsonl"\ntrace_speedup = 4\n'
                          'trace_window_s = [0, inf]\n[bench]\nrepeats = 2\nmax_concurrency = 8\n'
                          '[profile]\nconcurrency = 8\n')
    s = spec.bench_settings()
    assert (s.dataset, s.dataset_path, s.trace_speedup, s.trace_window_s) == ("mooncake", "t.jsonl", 4.0,
                                                                               (0.0, float("inf")))
    assert (s.concurrency, s.num_requests, s.repeats, s.max_concurrency) == ([], None, 2, 8)  # the whole trace
    assert spec.profile_concurrency == 8
    rates = parse_campaign(HEAD + "[workload]\nburstiness = 0.25\ninput_len = 64\n[bench]\nrequest_rate = [2, 4]\n"
                           "[profile]\nconcurrency = 4\n").bench_settings()
    assert (rates.request_rate, rates.burstiness, rates.concurrency, rates.input_len) == ([2.0, 4.0], 0.25, [], 64)
    assert rates.num_requests == 64
    old = parse_campaign(HEAD + "[bench]\ninput_len = 32\nconcurrency = [2]\n").bench_settings()
    assert (old.input_len, old.concurrency) == (32, [2])  # a campaign written before [workload] reads as it did


def test_a_missing_trace_file_is_refused_when_a_run_starts(tmp_path):
    text = HEAD + f'[workload]\ndataset = "mooncake"\ndataset_path = "{tmp_path / "t.jsonl"}"\n[profile]\nconcurrency = 2\n'
    spec = parse_campaign(text, "c.toml")
    with pytest.raises(RooftopError, match=r"c.toml: workload.dataset_path: '.*t.jsonl' is not a file .*Mooncake"):
        check_engines_installed(spec, "c.toml")
