"""The campaign's goal as an SLO: per-level goodput and attainment across repeats, each variant's SLO
capacity with its interval, a lever's capacity beside its base's, and the diagnosis naming the bound
missed first. A store written as the runner writes it (bench summary.json level dicts)."""

import math

import pytest

from rooftop.campaign.collect import COMPARISON, collect
from rooftop.campaign.diagnosis import diagnose
from rooftop.campaign.evidence import LevelEffect
from rooftop.campaign.store import Store
from rooftop.campaign.verdicts import capacity_change, wins
from rooftop.errors import RooftopError
from rooftop.report import summary_md
from rooftop.spec.campaign import parse_campaign

SPEC = """
[campaign]
name = "slo"
goal = "serve chat within its SLO"
[deployment]
engine = "embedded"
model = "tiny"
[bench]
concurrency = [1, 2, 4, 8]
repeats = 3
[profile]
enabled = false
[slo]
ttft_ms = 1000
tpot_ms = 100
[[lever]]
name = "cap"
args = { context-length = 4096 }
"""

# variant -> concurrency -> attainment of each repeat
ATTAINMENT = {
    "baseline": {1: [1.0, 1.0, 1.0], 2: [1.0, 0.975, 0.975], 4: [0.5, 0.6, 0.4], 8: [0.1, 0.2, 0.1]},
    "cap": {1: [1.0, 1.0, 1.0], 2: [1.0, 1.0, 1.0], 4: [1.0, 0.975, 0.975], 8: [0.3, 0.2, 0.4]},
}
REQUESTS = 40


def _level(c: int, attainment: float, wall_s: float = 10.0) -> dict:
    """One repeat of one level, with the keys `rooftop bench --goodput` writes."""
    met = round(attainment * REQUESTS)
    tok_s = 100.0 * c
    return {"concurrency": c, "valid": True, "stopped_early": False, "completed": REQUESTS, "failed": 0,
            "output_tok_s": {"mean": tok_s}, "ttft_ms": {"mean": 200.0}, "tpot_ms": {"mean": 10.0 * c},
            "request_s": {"mean": REQUESTS / wall_s}, "goodput_req_s": {"mean": met / wall_s},
            "slo_attainment": {"mean": met / REQUESTS}, "slo_met": met,
            # TPOT is the bound missed: TTFT holds for nearly every request
            "slo_bounds": {"ttft": min(1.0, met / REQUESTS + 0.4), "tpot": met / REQUESTS}}


@pytest.fixture
def store(tmp_path):
    st = Store.create(tmp_path)
    st.put_run("slo", "serve chat within its SLO", "independent", SPEC, "slo.toml", {})
    st.put_decision(COMPARISON, "cap", {"lever": "cap", "variant": "cap", "base_variant": "baseline",
                                        "series": "main"})
    for variant, levels in ATTAINMENT.items():
        for c, per_repeat in levels.items():
            for r, a in enumerate(per_repeat):
                st.put_level("main", variant, r, c, _level(c, a), True)
    yield st
    st.close()


def test_levels_carry_goodput_and_attainment_with_intervals(store):
    ev = collect(store)
    base = ev.variants["baseline"]
    lv = base.level(4)
    assert lv.slo_attainment == pytest.approx(0.5)  # (20 + 24 + 16) / 3 / 40
    assert lv.goodput_req_s == pytest.approx(2.0)  # 20 of 40 requests in 10 s, on average
    assert lv.attainment_low < 0.5 < lv.attainment_high <= 1.0
    assert lv.goodput_low < 2.0 < lv.goodput_high
    assert lv.slo_bounds == pytest.approx({"ttft": 0.9, "tpot": 0.5})
    assert base.level(1).attainment_high == 1.0  # capped: a share never exceeds 1
    table = summary_md.results(ev, "single")
    assert "goodput req/s [95% CI]" in table and "SLO met % [95% CI]" in table
    assert "| 4 | 400.0 (no interval) |" in table and "| 50 [" in table


def test_capacity_per_variant_and_the_lever_beside_its_base(store):
    ev = collect(store)
    base, cap = ev.variants["baseline"].slo_capacity, ev.variants["cap"].slo_capacity
    # C=2's attainment interval lies above 90%, C=4's below it: the capacity is C=2 for certain
    assert (base["load"], base["low"], base["high"], base["reached"]) == (2, 2, 2, True)
    assert base["next_tested"] == 4
    assert (cap["load"], cap["low"], cap["high"]) == (4, 4, 4)
    assert capacity_change(base, cap) == "higher"
    assert ev.slo["describe"] == "TTFT ≤ 1000 ms, TPOT ≤ 100 ms for 90% of requests"
    text = summary_md.levers(ev)
    assert "Capacity under the SLO (TTFT ≤ 1000 ms, TPOT ≤ 100 ms for 90% of requests)" in text
    assert "| cap | baseline: C=2 [2, 2] | cap: C=4 [4, 4] | higher |" in text
    assert "goodput ratio" in text
    effect = ev.lever("cap").effect("goodput_req_s", 4)
    assert effect.verdict == "faster" and effect.ratio == pytest.approx((40 + 39 + 39) / 3 / 20)


def test_diagnosis_names_the_capacity_and_the_bound_missed_first(store):
    ev = collect(store)
    dx = diagnose(ev)
    slo = next(f for f in dx.findings if f.rule == "slo")
    assert slo.title == "SLO capacity C=2"
    assert slo.sentence.startswith("SLO capacity C=2 [2, 2]: TTFT ≤ 1000 ms, TPOT ≤ 100 ms for 90% of requests; "
                                   "between the levels tested it lies in [2, 4)")
    assert "At C=4 50% [23%, 77%] of requests met it; the bound missed most is TPOT ≤ 100 ms (50% met; " \
           "TTFT ≤ 1000 ms 90%)" in slo.sentence
    assert slo.numbers["limiting_bound"] == "tpot" and slo.numbers["missed_at"] == 4
    lever = next(f for f in dx.findings if f.numbers.get("lever") == "cap")
    assert "capacity under the SLO C=2 [2, 2] → C=4 [4, 4] (higher)" in lever.sentence


def test_an_uncertain_level_widens_the_interval(tmp_path):
    st = Store.create(tmp_path)
    st.put_run("slo", "", "independent", SPEC.split("[[lever]]")[0], "slo.toml", {})
    for c, per_repeat in {1: [1.0, 1.0, 1.0], 2: [0.95, 0.85, 0.95], 4: [0.2, 0.3, 0.2]}.items():
        for r, a in enumerate(per_repeat):
            st.put_level("main", "baseline", r, c, _level(c, a), True)
    cap = collect(st).variants["baseline"].slo_capacity
    st.close()
    # C=2's mean attainment (0.917) meets 90%, but a resample of its repeats can miss it
    assert (cap["load"], cap["low"], cap["high"]) == (2, 1, 2)


def test_a_level_with_failed_requests_counts_against_the_slo(tmp_path):
    st = Store.create(tmp_path)
    st.put_run("slo", "", "independent", SPEC.split("[[lever]]")[0], "slo.toml", {})
    for r in range(3):
        st.put_level("main", "baseline", r, 1, _level(1, 1.0), True)
        bad = {**_level(2, 0.5), "valid": False, "failed": 20, "invalid_reason": "20 request(s) failed"}
        st.put_level("main", "baseline", r, 2, bad, False)
    cap = collect(st).variants["baseline"].slo_capacity
    st.close()
    assert cap["load"] == 1 and cap["reached"] and cap["tested"] == [1, 2]


def test_missed_everywhere_and_met_everywhere():
    missed = {"load": None, "low": None, "high": None, "reached": True, "tested": [1, 2],
              "method": "bootstrap over repeats"}
    met = {"load": 2, "low": 2, "high": None, "reached": False, "tested": [1, 2],
           "method": "bootstrap over repeats"}
    assert capacity_change(missed, met) == "higher"
    assert capacity_change(met, missed) == "lower"
    assert capacity_change(met, met) == "same level"
    assert capacity_change(None, met) == "not measured"


def test_a_lever_that_costs_goodput_does_not_join_the_baseline():
    def e(metric, verdict):
        return LevelEffect(4, metric, 1.0, 1.0, 1.0, math.nan, math.nan, verdict, 3, 3)

    faster = [e("output_tok_s", "faster"), e("tpot_ms", "no difference within noise")]
    assert wins(faster)
    assert not wins([*faster, e("goodput_req_s", "slower")])


@pytest.mark.parametrize(("section", "problem"), [
    ("[slo]\nattainment = 0.9\n", "an SLO needs at least one of ttft_ms, tpot_ms, e2el_ms"),
    ("[slo]\nttft_ms = 500\nattainment = 1.5\n", "slo.attainment"),
    ("[slo]\nttft_ms = -5\n", "slo.ttft_ms"),
    ("[slo]\nttft_ms = inf\n", "slo.ttft_ms: Input should be a finite number"),
])
def test_a_bad_slo_section_is_one_clear_error(section, problem):
    with pytest.raises(RooftopError) as exc:
        parse_campaign(SPEC.split("[slo]")[0] + section, "c.toml")
    assert problem in str(exc.value)


def test_the_attainment_plot_is_drawn_only_with_an_slo(store, tmp_path):
    from matplotlib import image

    from rooftop.report import plots

    ev = collect(store)
    made = plots.write_all(ev, tmp_path / "plots")
    assert "slo" in made
    assert image.imread(made["slo"]).shape[:2] == (495, 770)  # 7 x 4.5 in at 110 dpi
    ev.slo = None
    assert "slo" not in plots.write_all(ev, tmp_path / "plots2")


def test_a_lever_losing_goodput_through_failed_requests_is_judged_and_shown_by_it(tmp_path):
    """The lever is faster at C=1, but at C=4 every repeat fails some requests (invalid) and meets the SLO
    for half of them: its goodput there is judged against the base's, the level stays in its table with
    its goodput and attainment, and it does not join the baseline."""
    st = Store.create(tmp_path)
    st.put_run("slo", "", "independent", SPEC, "slo.toml", {})
    st.put_decision(COMPARISON, "cap", {"lever": "cap", "variant": "cap", "base_variant": "baseline",
                                        "series": "main"})
    for r in range(3):
        for c in (1, 4):
            st.put_level("main", "baseline", r, c, _level(c, 1.0), True)
        st.put_level("main", "cap", r, 1, {**_level(1, 1.0), "output_tok_s": {"mean": 150.0 + r}}, True)
        bad = {**_level(4, 0.5 - r / 40), "valid": False, "failed": 20, "invalid_reason": "20 request(s) failed"}
        st.put_level("main", "cap", r, 4, bad, False)
    ev = collect(st)
    st.close()
    lever = ev.lever("cap")
    assert lever.effect("goodput_req_s", 4).verdict == "slower"
    assert lever.effect("output_tok_s", 1).verdict == "faster" and lever.effect("output_tok_s", 4) is None
    assert not wins(lever.effects)
    lv = ev.variants["cap"].level(4)
    assert lv is not None and not lv.valid and math.isnan(lv.tok_s)
    assert lv.goodput_req_s == pytest.approx((20 + 19 + 18) / 3 / 10) and lv.slo_attainment == pytest.approx(0.475)
    table = summary_md.results(ev, "single")
    assert "| 4 | – | – | – | 1.90 [" in table and "| 3 | **no** |" in table
    base_cap, cap_cap = ev.variants["baseline"].slo_capacity, ev.variants["cap"].slo_capacity
    assert (cap_cap["load"], cap_cap["high"]) == (1, 1)
    assert capacity_change(base_cap, cap_cap) == "lower"
    # a lever with no throughput or goodput verdict against it still stays out when its capacity is lower
    faster = [LevelEffect(1, "output_tok_s", 1.0, 1.5, 1.5, 1.4, 1.6, "faster", 3, 3)]
    assert wins(faster) and wins(faster, "higher") and not wins(faster, "lower")


def test_a_level_the_server_stopped_answering_in_counts_as_a_miss(tmp_path):
    st = Store.create(tmp_path)
    st.put_run("slo", "", "independent", SPEC.split("[[lever]]")[0], "slo.toml", {})
    for r in range(3):
        for c in (1, 2):
            st.put_level("main", "baseline", r, c, _level(c, 1.0), True)
    gone = {**_level(4, 0.1), "valid": False, "stopped_early": True, "invalid_reason": "level stopped early"}
    st.put_level("main", "baseline", 0, 4, gone, False)
    cap = collect(st).variants["baseline"].slo_capacity
    st.close()
    assert (cap["load"], cap["low"], cap["high"], cap["reached"], cap["tested"]) == (2, 2, 2, True, [1, 2, 4])
    assert "; C=4 stopped early (the server stopped answering) and counts as a miss" in cap["sentence"]


@pytest.mark.parametrize(("bench", "problem"), [
    ('telemetry = "yes"', "bench.telemetry: Input should be a valid boolean"),
    ('dcgm_url = "dcgm-host/metrics"', "bench.dcgm_url: 'dcgm-host/metrics' needs http:// or https:// before the host"),
    ('dcgm_url = "http://[::1"', "bench.dcgm_url: 'http://[::1' not a URL"),
    ('telemetry = false\ndcgm_url = "http://h:9400/metrics"', "dcgm_url has no effect with telemetry = false"),
])
def test_a_bad_telemetry_setting_is_one_clear_error(bench, problem):
    with pytest.raises(RooftopError) as exc:
        parse_campaign(SPEC.replace("[bench]\n", f"[bench]\n{bench}\n"), "c.toml")
    assert problem in str(exc.value)
    assert parse_campaign(SPEC.replace("[bench]\n", '[bench]\ndcgm_url = "https://h:9400/metrics"\n'),
                          "c.toml").bench.dcgm_url == "https://h:9400/metrics"
