"""One bench-settings type, one set of rules: a value `rooftop bench` refuses, a campaign's [bench] refuses
with the same words, naming the key where the command line names the flag."""

import pytest

from rooftop.errors import RooftopError
from rooftop.spec.bench import KEYS, BenchSettings, SettingError
from rooftop.spec.campaign import parse_campaign

CAMPAIGN = """
[campaign]
name = "t"
[model]
preset = "tiny"
[deployment]
engine = "embedded"
[bench]
{bench}
"""

# (settings, the campaign's [bench] lines, the flag's message, the campaign's message, the rule's words)
SAME_RULE = [
    ({"input_len": 0}, "input_len = 0", "--input-len 0", "bench.input_len: 0", ": a prompt needs at least one token"),
    ({"confidence": 95.0}, "confidence = 95.0", "--confidence 95", "bench.confidence: 95",
     " is not a confidence level: it must lie strictly between 0.5 and 1"),
    ({"timeout_s": float("inf")}, "timeout_s = inf", "--timeout inf", "bench.timeout_s: inf",
     ": a request's timeout must be a positive, finite number of seconds"),
    ({"num_requests": 0}, "requests_per_level = 0", "--num-requests 0", "bench.requests_per_level: 0",
     ": a level needs at least one request"),
    ({"prefix_len": 8}, "prefix_len = 8", "--prefix-len 8 has no effect with --dataset random",
     "bench.prefix_len: 8 has no effect with dataset = 'random'", ": only "),
    ({"concurrency": [0, 4]}, "concurrency = [0, 4]", "--concurrency 0,4", "bench.concurrency: [0, 4]",
     ": a closed-loop level keeps at least 1 request in flight"),
    ({"telemetry": False, "dcgm_url": "http://h:9400/metrics"}, 'telemetry = false\ndcgm_url = "http://h:9400/metrics"',
     "--dcgm-url has no effect with --no-telemetry", "bench.dcgm_url: dcgm_url has no effect with telemetry = false",
     ""),
]


@pytest.mark.parametrize("settings,bench,flag,key,words", SAME_RULE)
def test_a_rule_has_one_wording_on_the_command_line_and_in_a_campaign(settings, bench, flag, key, words):
    with pytest.raises(SettingError) as cli:
        BenchSettings(**settings).check()
    assert cli.value.problem.startswith(flag + words)
    with pytest.raises(RooftopError) as campaign:
        parse_campaign(CAMPAIGN.format(bench=bench), "c.toml")
    assert f"c.toml: {key}{words}" in str(campaign.value)


def test_the_fix_names_the_setting_as_the_caller_spells_it():
    with pytest.raises(SettingError) as cli:
        BenchSettings(dataset="prefix", prefix_len=300, input_len=256).check()
    assert cli.value.fix == "e.g. --prefix-len 128"
    with pytest.raises(SettingError) as key:
        BenchSettings(dataset="prefix", prefix_len=300, input_len=256).check(KEYS)
    assert key.value.fix == "e.g. prefix_len = 128" and key.value.setting == "prefix_len"


def test_an_open_loop_is_one_kind_of_loop():
    BenchSettings(request_rate=[2.0, 4.0], concurrency=[], max_concurrency=8).check()
    with pytest.raises(SettingError, match=r"^--concurrency \(closed-loop levels\) and --request-rate"):
        BenchSettings(request_rate=[2.0], concurrency=[4]).check()
    with pytest.raises(SettingError, match="^--max-concurrency 8 caps an open loop"):
        BenchSettings(max_concurrency=8).check()
