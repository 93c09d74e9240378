"""GPU telemetry in a campaign: each repeat's window (as `rooftop bench` stores it with the level) pooled
across repeats per level, shown in SUMMARY's level tables and plots; without telemetry, why, once."""

import pytest

from rooftop.bench.summary import level_telemetry
from rooftop.bench.telemetry import Sample, summarize
from rooftop.campaign.collect import TELEMETRY_NOTE_SUBJECT, collect
from rooftop.campaign.store import Store
from rooftop.report import plots, summary_md

SPEC = """
[campaign]
name = "gpu"
[deployment]
engine = "embedded"
model = "tiny"
[bench]
concurrency = [1, 4]
repeats = 3
[profile]
enabled = false
"""

WALL_S = 10.0


def _window(power_w: float, util: float, tokens: int) -> dict:
    """One repeat's telemetry of one GPU over a 10 s level: constant power and utilization, the energy
    counter rising with the power, read every second."""
    samples = [Sample(t_ns=int(t * 1e9), gpu=0, sm_util_pct=util, mem_util_pct=util / 2, sm_clock_mhz=1980.0,
                      mem_used_mib=80_000.0, power_w=power_w, energy_j=1000.0 + power_w * t)
               for t in range(11)]
    return summarize(samples, tokens, WALL_S, "nvml", start_ns=0, end_ns=int(WALL_S * 1e9))


def _level(c: int, power_w: float, util: float, tokens: int) -> dict:
    return {"concurrency": c, "valid": True, "output_tok_s": {"mean": tokens / WALL_S},
            "ttft_ms": {"mean": 50.0}, "tpot_ms": {"mean": 5.0 * c},
            "telemetry": level_telemetry([_window(power_w, util, tokens)], 0.95, 0)}


@pytest.fixture
def store(tmp_path):
    st = Store.create(tmp_path)
    st.put_run("gpu", "", "independent", SPEC, "gpu.toml", {})
    for r, k in enumerate((1.0, 0.9, 1.1)):
        st.put_level("main", "baseline", r, 1, _level(1, 300.0 * k, 40.0, 2000), True)
        st.put_level("main", "baseline", r, 4, _level(4, 500.0 * k, 90.0, 6000), True)
    yield st
    st.close()


def test_repeats_are_pooled_per_level(store):
    ev = collect(store)
    lv = ev.variants["baseline"].level(4)
    t = lv.telemetry
    assert t["source"] == "nvml" and t["gpus"] == [0] and t["repeats"] == 3 and t["energy_source"] == "counter"
    assert "windows" not in t
    # 500 W x (1, 0.9, 1.1) over 10 s for 6000 tokens: 0.8333, 0.75, 0.9167 J/tok
    j = t["all"]["j_per_output_token"]
    assert j["per_repeat"] == pytest.approx([5000 / 6000, 4500 / 6000, 5500 / 6000], abs=1e-6)
    assert j["mean"] == pytest.approx(5000 / 6000, abs=1e-6)
    assert j["ci_low"] < j["mean"] < j["ci_high"]
    assert t["all"]["power_total_w"]["mean"] == pytest.approx(500.0)
    assert t["all"]["sm_util_mean_pct"]["mean"] == pytest.approx(90.0)


def test_summary_shows_the_gpu_columns_and_says_what_they_are(store, tmp_path):
    ev = collect(store)
    text = summary_md.results(ev, "single")
    assert "GPU telemetry (NVML, GPU 0, over each level's measured window)" in text
    assert "GPU util % [95% CI]" in text and "J/tok [95% CI]" in text
    row = next(line for line in text.splitlines() if line.startswith("| 4 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == "90 (no interval)"  # utilization 90% in every repeat
    assert cells[5] == "1980 (no interval)"
    assert cells[6].startswith("500 [") and cells[7].startswith("0.833 [")
    made = plots.write_all(ev, tmp_path / "plots")
    assert "telemetry" in made


def test_without_telemetry_the_summary_says_why_once(tmp_path):
    st = Store.create(tmp_path)
    st.put_run("gpu", "", "independent", SPEC, "gpu.toml", {})
    for r in range(3):
        st.put_level("main", "baseline", r, 1, {"concurrency": 1, "valid": True, "output_tok_s": {"mean": 10.0},
                                               "ttft_ms": {"mean": 50.0}, "tpot_ms": {"mean": 5.0},
                                               "telemetry": None}, True)
    note = "GPU telemetry off: no NVML: libnvidia-ml.so.1 not found (no NVIDIA driver on this host)"
    st.put_analysis(TELEMETRY_NOTE_SUBJECT, "telemetry_note", {"note": note})
    ev = collect(st)
    st.close()
    assert ev.telemetry_note == note
    single, pd = summary_md.results(ev, "single"), summary_md.results(ev, "pd")
    assert single.count(note) == 1 and note not in pd
    assert "J/tok" not in single
    assert "telemetry" not in plots.write_all(ev, tmp_path / "plots")


def test_summary_says_a_levels_telemetry_note_and_short_coverage(tmp_path):
    """As `rooftop bench` prints them: the reads that failed at C=4, and C=4's readings stopping for 6 s."""
    st = Store.create(tmp_path)
    st.put_run("gpu", "", "independent", SPEC, "gpu.toml", {})
    for r in range(3):
        st.put_level("main", "baseline", r, 1, _level(1, 300.0, 40.0, 2000), True)
        samples = [Sample(t_ns=int(t * 1e9), gpu=0, sm_util_pct=90.0, power_w=500.0, energy_j=1000.0 + 500 * t)
                   for t in (0, 1, 2, 8, 9, 10)]
        w = summarize(samples, 6000, WALL_S, "nvml", start_ns=0, end_ns=int(WALL_S * 1e9), interval_s=1.0,
                      note="nvml reads failed: GPU 0 SM clock failed in 6 of 6 reads (Unknown Error)")
        st.put_level("main", "baseline", r, 4, {**_level(4, 500.0, 90.0, 6000),
                                                "telemetry": level_telemetry([w], 0.95, 0)}, True)
    text = summary_md.results(collect(st), "single")
    st.close()
    assert ("_GPU telemetry at C=4: nvml reads failed: GPU 0 SM clock failed in 6 of 6 reads (Unknown Error); "
            "no reading for 6.0 s at a stretch (GPU 0; readings every 1 s): the gauges miss that time and "
            "coverage leaves it out (and notes in 2 more repeats); figures from the readings that succeeded._") in text
    assert "_GPU telemetry at C=4 covers 50% of the level (longest stretch without a reading 6.0 s)._" in text
    assert "GPU telemetry at C=1" not in text
