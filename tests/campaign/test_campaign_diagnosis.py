"""Diagnosis over realistic evidence read back from a real store: the demo's story must come out."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from sample_store import populate  # noqa: E402

from rooftop.campaign.collect import collect  # noqa: E402
from rooftop.campaign.diagnosis import diagnose, family, rank  # noqa: E402
from rooftop.campaign.evidence import Finding  # noqa: E402


def _evidence(tmp_path):
    st = populate(tmp_path)
    ev = collect(st)
    st.close()
    return ev


def test_capacity_bound_indexer_is_the_top_finding_with_share_and_lever_gain(tmp_path):
    ev = _evidence(tmp_path)
    dx = diagnose(ev)
    top = dx.top
    assert top.title == "Capacity-bound indexer"
    assert top.numbers["share"] == 0.70
    assert "70% of the step" in top.sentence and "65536" in top.sentence
    # the ops on the capacity dim are 85% of the indexer here: both figures, each for what it is
    sized = top.numbers["sized_ms_per_step"]
    assert sized == pytest.approx(0.85 * top.numbers["ms_per_step"])
    assert f"on dim 65536 (= context-length 65536) take {sized:.2f} ms per step, and the indexer 70% of the step (" \
        f"{top.numbers['ms_per_step']:.2f} of" in top.sentence
    # The cited lever is the larger capacity lever (context-cap ~5x, not indexer-actual ~4.5x).
    assert top.numbers["lever"] == "context-cap"
    assert 4.5 < top.numbers["lever_ratio_low"] < top.numbers["lever_ratio"] < top.numbers["lever_ratio_high"] < 5.6
    assert top.numbers["lever_verdict"] == "faster"
    assert f"{top.numbers['lever_ratio']:.2f}× [{top.numbers['lever_ratio_low']:.2f}" in top.sentence
    assert top.expected_gain == top.numbers["lever_ratio"]


def test_pd_did_not_help_with_intervals(tmp_path):
    dx = diagnose(_evidence(tmp_path))
    pd = next(f for f in dx.findings if f.rule == "pd")
    assert pd.numbers["said"] == "did not help"
    assert pd.expected_gain is None
    for e in pd.numbers["effects"]:
        assert e["low"] < 1.0 < e["high"]
        assert f"[{e['low']:.2f}, {e['high']:.2f}]" in pd.sentence
    # no difference within noise says nothing of what binds: no cause is claimed
    assert "no gain beyond noise" in pd.sentence and "bottleneck" not in pd.sentence


def test_what_binds_next_reads_the_fixed_variants_profile(tmp_path):
    dx = diagnose(_evidence(tmp_path))
    nxt = dx.binds_next
    assert nxt.numbers["variant"] == "context-cap" and nxt.numbers["component"] == "moe"
    assert nxt.numbers["floor_ms"] == 2.0
    assert 20 < nxt.numbers["floor_ratio"] < 40  # ~57 ms measured against a 2 ms floor
    n = nxt.numbers
    assert nxt.sentence.startswith(f"With context-cap applied, the CPU is busy {n['busy_ms']:.2f} ms per profiled "
                                   f"step and the moe binds next at")
    assert (f"; context-cap's served decode step of {n['measured_step_ms']:.2f} ms [{n['measured_step_low']:.2f}, "
            f"{n['measured_step_high']:.2f}] at C=4 is") in nxt.sentence
    assert n["roofline_variant"] == n["variant"] == "context-cap"


def test_next_takes_profile_and_roofline_from_one_variant_and_only_after_a_fix(tmp_path):
    """PD helped but pd has no profile of its own: the Next sentence must not lay the baseline's profile
    beside pd's roofline; and a top finding that fixes nothing (the idle GPU's bound) has no Next."""
    from dataclasses import replace

    ev = _evidence(tmp_path)
    ev.profiles[ev.baseline].capacity_findings = []  # no capacity finding: PD's gain leads
    pd = ev.lever("pd")
    for e in pd.effects:
        if e.metric == "output_tok_s":
            e.ratio, e.ratio_low, e.ratio_high, e.verdict = 9.0, 8.0, 10.0, "faster"
    dx = diagnose(ev)
    assert dx.top.rule == "pd" and dx.binds_next is None  # no pd profile: nothing of one variant to say
    ev.profiles["pd/decode"] = replace(ev.profiles["context-cap"], variant="pd/decode")
    nxt = diagnose(ev).binds_next
    assert nxt.numbers["variant"] == "pd/decode" and nxt.numbers["roofline_variant"] == "pd"
    assert nxt.sentence.startswith("With pd applied (its decode worker), the CPU is busy")
    assert f"pd's served decode step of {ev.rooflines['pd'].measured_step_ms:.2f} ms [" in nxt.sentence

    ev = _evidence(tmp_path)
    ev.profiles[ev.baseline].capacity_findings, ev.levers = [], []  # no measured gain: the idle bound leads
    prof = ev.profiles[ev.baseline]
    prof.device, prof.idle_share = "gpu", 0.9
    prof.busy_ms_per_step = 0.5 * ev.variants[ev.baseline].level(prof.concurrency).tpot_ms
    dx = diagnose(ev)
    assert dx.top.rule == "idle" and dx.binds_next is None


def test_context_rules_tpot_growth_and_roofline_gap(tmp_path):
    dx = diagnose(_evidence(tmp_path))
    by_rule = {f.rule: f for f in dx.findings}
    assert by_rule["tpot_growth"].numbers["growth"] > 2.5  # 100 ms at C=1 -> ~287 ms at C=4
    roof = by_rule["roofline"]
    assert roof.numbers["gap_component"] == "indexer"
    assert roof.expected_gain is None  # context: the gap to the floor is not a priced fix
    assert 130 < roof.numbers["ratio"] < 160
    # The gap's 'measured' side is the component's profile share laid onto the served step: the sentence
    # says so, gives the profile's own time per step beside it, and the step's interval.
    n = roof.numbers
    assert n["component_measured_ms"] == pytest.approx(n["component_share"] * n["measured_step_ms"])
    assert (f"takes {n['measured_step_ms']:.2f} ms [{n['measured_step_low']:.2f}, {n['measured_step_high']:.2f}] "
            f"(TPOT) against") in roof.sentence
    assert (f"the indexer: ≈{n['component_measured_ms']:.2f} ms, its 70% share of the CPU time laid onto that "
            f"step ({n['component_profile_ms']:.2f} ms of CPU time per step in the baseline profile at C=4)") in roof.sentence
    assert " measured against" not in roof.sentence
    # Findings without a gain rank after every finding with one.
    gains = [f.expected_gain for f in dx.findings]
    assert gains == sorted(gains, key=lambda g: (g is None, -(g or 0)))


def test_tpot_growth_fires_on_the_ratios_interval_not_its_means(tmp_path):
    ev = _evidence(tmp_path)
    levels = ev.variants[ev.baseline].levels
    lo, hi = levels[0], levels[-1]
    g = next(f for f in diagnose(ev).findings if f.rule == "tpot_growth")
    n = g.numbers
    assert n["growth_low"] == pytest.approx(hi.tpot_low / lo.tpot_high)
    assert n["growth_high"] == pytest.approx(hi.tpot_high / lo.tpot_low)
    assert n["growth_low"] < n["growth"] < n["growth_high"]
    assert g.sentence.startswith(f"TPOT grows {n['growth']:.1f}× [{n['growth_low']:.1f}, {n['growth_high']:.1f}] "
                                 f"from C={lo.concurrency} ({lo.tpot_ms:.1f} ms [{lo.tpot_low:.1f}, ")
    # Means 1.6x apart, intervals overlapping the flag: the low end (1.2x) does not pass, no finding.
    lo.tpot_ms, lo.tpot_low, lo.tpot_high = 10.0, 9.0, 11.0
    hi.tpot_ms, hi.tpot_low, hi.tpot_high = 16.0, 13.0, 19.0
    assert not [f for f in diagnose(ev).findings if f.rule == "tpot_growth"]
    hi.tpot_ms, hi.tpot_low, hi.tpot_high = 20.0, 17.0, 23.0  # low end 17/11 = 1.55: passes
    assert next(f for f in diagnose(ev).findings if f.rule == "tpot_growth").sentence.startswith(
        "TPOT grows 2.0× [1.5, 2.6]")
    lo.tpot_low = lo.tpot_high = float("nan")  # one repeat: no interval, nothing to judge beyond noise
    assert not [f for f in diagnose(ev).findings if f.rule == "tpot_growth"]


def test_rank_and_family():
    a = Finding("a", "", {}, "", None)
    b = Finding("b", "", {}, "", 1.5)
    c = Finding("c", "", {}, "", 3.0)
    assert [f.title for f in rank([a, b, c])] == ["c", "b", "a"]
    assert family("model.layers.3.self_attn.indexer") == "indexer"
    assert family("moe_routed") == "moe" and family("attn_core") == "attention"


def test_gpu_idle_is_judged_against_the_served_step_not_the_profiled_one(tmp_path):
    """A profile's idle share is of a few profiled steps, with the profiler's host cost in them: a
    profile 90% idle says little about the served step. Idle is 1 - GPU busy per step / the served step at the profiled
    level: the engine's own decode step where it exported one, else TPOT (an upper bound: TPOT also
    counts prefill steps interleaved with decode)."""
    ev = _evidence(tmp_path)
    prof = ev.profiles[ev.baseline]
    level = ev.variants[ev.baseline].level(prof.concurrency)
    assert level.decode_step_ms is None  # the sample store's levels come from a server without one
    prof.device, prof.idle_share = "gpu", 0.90
    prof.busy_ms_per_step = 0.6 * level.tpot_ms  # busy 60% of TPOT: idle at most 40%
    idle = next(f for f in diagnose(ev).findings if f.rule == "idle")
    assert abs(idle.numbers["idle_share"] - 0.40) < 1e-9
    assert f"against a TPOT of {level.tpot_ms:.2f} ms" in idle.sentence and "idle up to 40%" in idle.sentence
    assert "interleaved with decode" in idle.sentence
    assert "90% in the profiled steps" in idle.sentence and abs(idle.expected_gain - 1 / 0.6) < 1e-9
    assert idle.gain_high is None and idle.gain_text() == "up to ×1.67 (bound)"
    assert "up to ×1.67 (a bound: the host's whole share removed)" in idle.sentence
    assert f"levels {ev.baseline} C={level.concurrency}" in idle.evidence_pointer

    # The engine's own decode step, shorter than TPOT (prefills interleaved): judged against it.
    level.decode_step_ms = 0.85 * level.tpot_ms  # busy 0.6 / 0.85 of the served step: idle 29%
    idle = next(f for f in diagnose(ev).findings if f.rule == "idle")
    assert abs(idle.numbers["idle_share"] - (1 - 0.6 / 0.85)) < 1e-9
    assert f"busy {prof.busy_ms_per_step:.2f} ms of each {level.decode_step_ms:.2f} ms served decode step" \
        in idle.sentence and f"up to 40% against TPOT ({level.tpot_ms:.2f} ms)" in idle.sentence
    # Removing the host's share is a bound, known within the two figures: the column and the sentence
    # say the same range (they said '≤ ×1.42 (bound)' and 'at least 1.42×').
    assert abs(idle.expected_gain - 0.85 / 0.6) < 1e-9 and abs(idle.gain_high - 1 / 0.6) < 1e-9
    assert idle.gain_text() == f"up to ×{0.85 / 0.6:.2f}–{1 / 0.6:.2f} (bound)"
    assert f"could recover up to ×{0.85 / 0.6:.2f}–{1 / 0.6:.2f} (a bound" in idle.sentence
    assert "at least" not in idle.sentence

    # vLLM and SGLang export inter-token latency, not a step: it counts interleaved prefills as TPOT
    # does, so it bounds host time from above, never "at least".
    level.decode_step_source = "server_itl"
    idle = next(f for f in diagnose(ev).findings if f.rule == "idle")
    assert abs(idle.numbers["idle_share"] - (1 - 0.6 / 0.85)) < 1e-9
    assert f"inter-token latency of {level.decode_step_ms:.2f} ms" in idle.sentence
    assert "at most" in idle.sentence and "at least" not in idle.sentence and "served decode step" not in idle.sentence
    level.decode_step_ms = level.decode_step_source = None

    prof.busy_ms_per_step = 0.9 * level.tpot_ms  # idle 10% served: below the flag, no finding
    assert not [f for f in diagnose(ev).findings if f.rule == "idle"]

    prof.busy_ms_per_step = 0.01 * level.tpot_ms  # never more idle than the profile itself says
    assert next(f for f in diagnose(ev).findings if f.rule == "idle").numbers["idle_share"] == 0.90

    prof.concurrency = None  # no served level to compare with: the profile's own share
    idle = next(f for f in diagnose(ev).findings if f.rule == "idle")
    assert idle.numbers["idle_share"] == 0.90 and "each profiled step" in idle.sentence


def test_capacity_finding_cites_tpot_when_throughput_is_too_noisy_to_call(tmp_path):
    from rooftop.campaign.evidence import LevelEffect

    ev = _evidence(tmp_path)
    lever = next(lv for lv in ev.levers if lv.name == "context-cap")
    c = ev.profiles[ev.baseline].concurrency
    tok = lever.effect("output_tok_s", c)
    tok.ratio_low, tok.verdict = 0.5, "no difference within noise"  # one wild repeat, as on the H200
    lever.effects = [e for e in lever.effects if e.metric != "tpot_ms" or e.concurrency != c]
    lever.effects.append(LevelEffect(c, "tpot_ms", 8.0, 3.9, 0.49, 0.38, 0.59, "faster", 3, 3))
    top = next(f for f in diagnose(ev).findings if f.rule == "capacity")
    assert f"measured output tok/s {tok.ratio:.2f}× [0.50," in top.sentence
    assert f"(no difference within noise) and TPOT 0.49× [0.38, 0.59] at C={c} (faster)" in top.sentence


def _level_row(repeat: int, conc: int, tpot: float, steps: dict | None, valid: bool = True):
    from rooftop.campaign.store import LevelRow

    summary = {"output_tok_s": {"mean": 100.0 + repeat}, "ttft_ms": {"mean": 50.0}, "tpot_ms": {"mean": tpot}}
    if steps:
        summary["engine_steps"] = steps
        summary["engine_decode_step_ms"] = steps["decode"]["ms_per_step"]
    return LevelRow("single", "baseline", repeat, conc, summary, valid)


def test_level_stats_take_prefill_share_from_the_engine_step_histogram():
    """The server's step histogram over a level gives prefill's share of the engine's step time:
    66 prefill steps of 47.8 ms against 62 decode steps of 8.9 ms is 85% prefill (the H200 serve run)."""
    from rooftop.campaign.collect import level_stats

    h200 = {"decode": {"steps": 62, "ms_per_step": 8.9}, "prefill": {"steps": 66, "ms_per_step": 47.8}}
    half = {"decode": {"steps": 10, "ms_per_step": 5.0}, "prefill": {"steps": 1, "ms_per_step": 50.0}}
    rows = [_level_row(0, 64, 32.0, h200), _level_row(1, 64, 30.0, half)]
    (lv,) = level_stats(rows, confidence=0.95)
    want = (66 * 47.8 / (66 * 47.8 + 62 * 8.9) + 0.5) / 2
    assert abs(lv.prefill_share - want) < 1e-12 and abs(lv.prefill_step_ms - (47.8 + 50.0) / 2) < 1e-12
    assert lv.decode_step_ms == (8.9 + 5.0) / 2
    # A repeat without the histogram (or with decode steps only): no share for the level, as for the step.
    decode_only = {"decode": {"steps": 10, "ms_per_step": 5.0}}
    for other in (None, decode_only):
        (lv,) = level_stats([_level_row(0, 64, 32.0, h200), _level_row(1, 64, 30.0, other)], confidence=0.95)
        assert lv.prefill_share is None and lv.prefill_step_ms is None


def test_prefill_taking_much_of_the_engine_time_is_a_finding(tmp_path):
    ev = _evidence(tmp_path)
    levels = ev.variants[ev.baseline].levels

    def found():
        return [f for f in diagnose(ev).findings if f.rule == "prefill_share"]

    assert not found()  # no step histogram in the sample store: no finding
    top = levels[-1]
    top.decode_step_ms, top.prefill_share, top.prefill_step_ms = top.tpot_ms / 3.6, 0.85, 47.8
    levels[0].decode_step_ms, levels[0].prefill_share, levels[0].prefill_step_ms = levels[0].tpot_ms, 0.2, 40.0
    (f,) = found()  # the level with the largest share, TPOT well above the step: TPOT counts the prefills
    assert f.title == "Prefill takes 85% of the engine's time" and f.expected_gain is None
    assert f"At C={top.concurrency} prefill steps (47.8 ms each) take 85%" in f.sentence
    assert "is 3.6× the engine's own decode step" in f.sentence and "between its decode steps" in f.sentence
    assert f.evidence_pointer == f"levels {ev.baseline} C={top.concurrency}"
    top.decode_step_ms = top.tpot_ms / 1.01  # TPOT near the step: the prefills show in TTFT instead
    (f,) = found()
    assert f"they show in TTFT ({top.ttft_ms:.1f} ms)" in f.sentence and "take 15% of the time" in f.sentence
    top.prefill_share = 0.2  # a small share everywhere: nothing to say
    assert not found()


def test_a_bound_is_labelled_and_never_outranks_a_measured_gain(tmp_path):
    """The H200 demo's story: the levers that remove the capacity cost measure no gain beyond noise;
    the finding's ×3 is Amdahl's bound, labelled so, ranked below a lever that measured a gain, and
    it says what the missing gain means."""
    ev = _evidence(tmp_path)
    c = ev.profiles[ev.baseline].concurrency
    for name in ("context-cap", "indexer-actual"):
        tok = ev.lever(name).effect("output_tok_s", c)
        tok.ratio, tok.ratio_low, tok.ratio_high, tok.verdict = 1.44, 0.90, 2.23, "no difference within noise"
    winner = ev.lever("max-running").effect("output_tok_s", 4)
    winner.ratio, winner.ratio_low, winner.ratio_high, winner.verdict = 1.2, 1.1, 1.3, "faster"
    dx = diagnose(ev)
    cap = next(f for f in dx.findings if f.rule == "capacity")
    assert cap.gain_kind == "bound" and cap.expected_gain == 1 / (1 - 0.70)
    assert cap.gain_text() == "up to ×3.33 (bound)"
    assert "measured no gain beyond noise, so ×3.33 is a bound this deployment does not reach" in cap.sentence
    assert "with context-cap the profiled step takes 57.00 ms (from 280.00)" in cap.sentence
    lever = next(f for f in dx.findings if f.numbers.get("lever") == "max-running")
    assert lever.gain_kind == "measured" and lever.gain_text() == "×1.20 measured"
    assert dx.findings.index(lever) < dx.findings.index(cap)  # a bound never outranks a measurement
    tiers = [{"measured": 0, "bound": 1}.get(f.gain_kind, 2) if f.expected_gain else 2 for f in dx.findings]
    assert tiers == sorted(tiers)

    populate(tmp_path / "doc").close()  # and the documents say it the same way
    from rooftop.report.build import build_report

    summary = build_report(tmp_path / "doc").summary.read_text()
    assert "| 1 | Capacity-bound indexer | ×5." in summary and " measured | " in summary


def test_the_served_step_says_whether_it_is_the_engines_step_or_the_servers_itl(tmp_path):
    from rooftop.campaign.collect import level_stats
    from rooftop.campaign.store import Store

    st = Store.create(tmp_path)
    base = {"output_tok_s": {"mean": 100.0}, "ttft_ms": {"mean": 10.0}, "tpot_ms": {"mean": 12.0},
            "engine_decode_step_ms": 9.0}
    for r in range(2):  # embedded: the step histogram's decode step; vLLM: only the server's ITL
        st.put_level("main", "embedded", r, 4, {**base, "engine_steps": {"decode": {"ms_per_step": 9.0}}}, True)
        st.put_level("main", "vllm", r, 4, {**base, "engine_server": {"itl_ms": {"mean": 9.0}}}, True)
    embedded, = level_stats(st.levels("embedded"), 0.95)
    served, = level_stats(st.levels("vllm"), 0.95)
    assert embedded.decode_step_source == "engine_step" and embedded.served_step()[3] == "server decode step"
    assert served.decode_step_source == "server_itl" and served.served_step()[3] == "server inter-token latency"
    st.close()


def test_an_effect_from_one_repeat_says_it_has_no_interval():
    from rooftop.campaign.diagnosis import effect_text
    from rooftop.campaign.evidence import LevelEffect

    one = LevelEffect(1, "output_tok_s", 10.0, 6.3, 0.63, float("nan"), float("nan"),
                      "no difference within noise", 1, 1)
    assert effect_text(one) == "0.63× (one repeat: no interval) at C=1 (no difference within noise)"
    three = LevelEffect(1, "output_tok_s", 10.0, 6.3, 0.63, 0.55, 0.71, "slower", 3, 3)
    assert effect_text(three) == "0.63× [0.55, 0.71] at C=1 (slower)"


def test_a_lever_title_never_says_no_difference_when_its_text_names_one(tmp_path):
    """max-num-seqs-2 on vLLM: tok/s and TPOT within noise, TTFT 3.72× [1.53, 8.61] slower. The title said
    'no difference within noise'; a difference outside the interval is a difference, and the title says it."""
    from rooftop.campaign.diagnosis import verdict_title

    ev = _evidence(tmp_path)
    lever = ev.lever("max-running")
    c = max(e.concurrency for e in lever.effects)
    ttft = lever.effect("ttft_ms", c)
    ttft.ratio, ttft.ratio_low, ttft.ratio_high, ttft.verdict = 3.72, 1.53, 8.61, "slower"
    for metric in ("output_tok_s", "tpot_ms"):
        e = lever.effect(metric, c)
        e.ratio, e.ratio_low, e.ratio_high, e.verdict = 0.9, 0.5, 1.4, "no difference within noise"
    f = next(f for f in diagnose(ev).findings if f.numbers.get("lever") == "max-running")
    assert "TTFT 3.72× [1.53, 8.61] (slower)" in f.sentence
    assert f.title == "Lever max-running: TTFT slower; tok/s, TPOT no difference within noise"
    assert verdict_title([("tok/s", "faster"), ("TTFT", "faster")]) == "faster"
    assert verdict_title([("tok/s", "faster"), ("TTFT", "slower"), ("TPOT", "no difference within noise")]) \
        == "tok/s faster; TTFT slower; TPOT no difference within noise"


def _no_lever_gains(tmp_path):
    """The sample campaign as the vLLM example came out: no capacity-sized work, every lever within noise."""
    ev = _evidence(tmp_path)
    ev.profiles[ev.baseline].capacity_findings = []
    for lv in ev.levers:
        for e in lv.effects:
            if e.metric == "output_tok_s":
                e.ratio, e.ratio_low, e.ratio_high, e.verdict = 0.8, 0.5, 1.1, "no difference within noise"
    return ev


def test_without_a_gain_the_headline_answers_the_goal(tmp_path):
    """No lever gained: the headline says what bounds the decode step (component, share, × floor with its
    interval), then the levers that did not move tok/s — not the first lever that lost."""
    ev = _no_lever_gains(tmp_path)
    dx = diagnose(ev)
    top = dx.top
    assert top.rule == "what_bounds" and top.expected_gain is None and dx.binds_next is None
    assert top.title == "The indexer bounds the decode step"
    n = top.numbers
    assert n["component"] == "indexer" and n["share"] == 0.70
    roof = ev.rooflines[ev.baseline]
    assert n["floor_ratio"] == pytest.approx(roof.measured_step_ms / roof.floor_ms)
    assert n["floor_ratio_low"] == pytest.approx(roof.measured_step_low / roof.floor_ms)
    assert n["floor_ratio_low"] < n["floor_ratio"] < n["floor_ratio_high"]
    assert top.sentence.startswith(f"The indexer takes 70% of each decode step ({n['ms_per_step']:.2f} of "
                                   f"{n['busy_ms_per_step']:.2f} ms of CPU time per step in the baseline profile at C=4)")
    assert (f"is {n['floor_ratio']:.0f}× [{n['floor_ratio_low']:.0f}, {n['floor_ratio_high']:.0f}] its roofline floor "
            f"of 2.000 ms") in top.sentence and "0.010 ms of which is the indexer's" in top.sentence
    assert "No lever raised tok/s beyond noise at any level: " in top.sentence
    for lv in ev.levers:
        assert f"{lv.name} 0.80× [0.50, 1.10] at C=4 (no difference within noise)" in top.sentence
    # it says what the 'Largest component' finding said: that one is not repeated
    assert not [f for f in dx.findings if f.rule == "profile"]


def test_a_lever_that_gains_keeps_the_headline(tmp_path):
    """The demo's story: a lever gained, so its finding leads and no 'what bounds' finding is added."""
    dx = diagnose(_evidence(tmp_path))
    assert dx.top.title == "Capacity-bound indexer"
    assert not [f for f in dx.findings if f.rule == "what_bounds"]
    assert [f for f in dx.findings if f.rule == "profile"]
