"""Campaign files: the built-in demo loads; each kind of mistake gives one message naming file and key."""

import importlib.util
from pathlib import Path

import pytest

import rooftop.campaign
from rooftop.campaign.preflight import check_engines_installed
from rooftop.errors import RooftopError
from rooftop.spec.campaign import apply_lever, load_campaign, variant_name

DEMO = Path(rooftop.campaign.__file__).parent / "demo.toml"

GOOD = """
[campaign]
name = "t"
goal = "g"
mode = "cumulative"
[model]
preset = "tiny"
[deployment]
engine = "embedded"
args = { indexer-bound = "capacity", context-length = 65536 }
[bench]
concurrency = [4, 1, 4]
repeats = 2
[[lever]]
name = "pd"
topology = "pd"
prefill = { cpus = [0] }
decode = { cpus = "1" }
[[lever]]
name = "cap"
args = { context-length = 4096 }
env = { OMP_NUM_THREADS = 1 }
"""


def _write(tmp_path, text, name="c.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_demo_campaign_loads():
    spec = load_campaign(DEMO)
    names = [lv.name for lv in spec.levers]
    assert names == ["pd", "context-cap", "indexer-actual", "max-running"]
    assert spec.deployment.engine == "embedded" and spec.deployment.model == "tiny"
    assert spec.deployment.args["indexer-bound"] == "capacity"
    assert spec.deployment.args["context-length"] == 65536
    pd = apply_lever(spec.deployment, [spec.levers[0]])
    assert pd.topology == "pd" and pd.prefill.cpus == [0] and pd.decode.cpus == [1] and pd.single is None


def test_good_file_and_lever_merging(tmp_path):
    spec = load_campaign(_write(tmp_path, GOOD))
    assert spec.bench.concurrency == [1, 4]  # sorted, deduplicated
    # default amount when neither requests nor duration is given
    assert spec.bench.requests_per_level is None and spec.bench_settings().num_requests == 64
    assert spec.profile_concurrency == 4
    both = apply_lever(spec.deployment, spec.levers)
    assert both.args == {"indexer-bound": "capacity", "context-length": 4096}
    assert both.env == {"OMP_NUM_THREADS": "1"} and both.topology == "pd"
    assert spec.deployment.args["context-length"] == 65536  # the baseline is untouched
    assert variant_name([]) == "baseline" and variant_name(["cap"]) == "cap"
    assert variant_name(["pd", "cap"]) == "baseline+pd+cap"


@pytest.mark.parametrize(
    "old,new,expect",
    [
        ('goal = "g"', 'goal = "g"\nspeed = 3', "c.toml: campaign.speed: unknown key"),
        ("repeats = 2", 'repeats = "two"', "c.toml: bench.repeats: Input should be a valid integer"),
        ('env = { OMP_NUM_THREADS = 1 }', 'env = { OMP_NUM_THREADS = 1 }\nflags = ["x"]',
         'c.toml: lever #2 "cap".flags: unknown key'),
        ('mode = "cumulative"', 'mode = "sometimes"', "c.toml: campaign.mode: Input should be 'independent' or"),
        ('engine = "embedded"', 'engine = "tgi"', "c.toml: deployment.engine: Input should be"),
        ("concurrency = [4, 1, 4]", "concurrency = [0, 4]", "c.toml: bench.concurrency: [0, 4]: a closed-loop level keeps at least 1"),
        ('name = "cap"', 'name = "pd"', "lever name(s) used twice: pd"),
        ('prefill = { cpus = [0] }\n', "", 'c.toml: lever \'pd\': deployment: topology "pd" needs a [prefill] table'),
        ('name = "t"', 'name = "t"\nname = "u"', "c.toml: not valid TOML"),
    ],
)
def test_each_mistake_is_one_message_naming_file_and_key(tmp_path, old, new, expect):
    assert old in GOOD
    with pytest.raises(RooftopError) as info:
        load_campaign(_write(tmp_path, GOOD.replace(old, new, 1)))
    msg = str(info.value)
    assert expect in msg, msg
    assert "\n" not in msg.strip()  # one line


def test_missing_file(tmp_path):
    with pytest.raises(RooftopError, match="no such campaign file"):
        load_campaign(tmp_path / "nope.toml")


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed here")
def test_engine_not_installed_names_the_key(tmp_path):
    text = GOOD.replace('engine = "embedded"', 'engine = "sglang"').replace('preset = "tiny"', 'path = "/m"')
    p = _write(tmp_path, text)
    spec = load_campaign(p)  # loading does not need the engine; running does
    with pytest.raises(RooftopError) as info:
        check_engines_installed(spec, p)
    assert f"{p}: deployment.engine: engine 'sglang' (single) is not installed" in str(info.value)


def test_engine_not_installed_in_a_lever(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    text = GOOD.replace('name = "cap"', 'name = "cap"\nengine = "vllm"\nmodel = "/m"')
    p = _write(tmp_path, text)
    spec = load_campaign(p)
    with pytest.raises(RooftopError) as info:
        check_engines_installed(spec, p)
    assert 'lever "cap".engine: engine \'vllm\'' in str(info.value)
    check_engines_installed(load_campaign(_write(tmp_path, GOOD, "ok.toml")))  # embedded: installed
