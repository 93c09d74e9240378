"""A campaign's [bench] is checked when the campaign loads: what would fail only once the sweep ran,
after a deployment came up, is one message naming the key."""

import tomllib

import pytest
from pydantic import ValidationError

from rooftop.campaign.preflight import check_engines_installed
from rooftop.errors import RooftopError
from rooftop.spec.campaign import BenchSection, parse_campaign

BAD = {
    'dataset = "sharegpt"': "needs dataset_path",
    'dataset = "prefix"': "prefix_len\n  0: dataset = 'prefix' shares a prefix of at least 1 token",
    'dataset = "prefix"\nprefix_len = 300\ninput_len = 256': "prefix_len\n  300: dataset = 'prefix' shares",
    "prefix_len = 64": "prefix_len\n  64 has no effect",
    "duration_s = inf": "finite number",
    "duration_s = nan": "finite number",
    "timeout_s = inf": "finite number",
    "output_len = 0": "output_len\n  0: a request must generate at least one token",
}


@pytest.mark.parametrize("text", list(BAD))
def test_a_bench_that_cannot_run_is_refused_at_load(text):
    with pytest.raises(ValidationError) as err:
        BenchSection.model_validate(tomllib.loads(text))
    assert BAD[text] in str(err.value)


def test_good_benches_load():
    assert BenchSection.model_validate(tomllib.loads('dataset = "prefix"\nprefix_len = 128')).prefix_len == 128
    b = BenchSection.model_validate(tomllib.loads('dataset = "sharegpt"\ndataset_path = "x.json"\noutput_len = 0'))
    assert b.output_len == 0
    assert BenchSection(duration_s=30).requests_per_level is None
    assert BenchSection(duration_s=30, requests_per_level=100).requests_per_level == 100


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
    with pytest.raises(RooftopError, match="bench.dataset_path: .*gone.json is not a file"):
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
