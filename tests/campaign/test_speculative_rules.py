"""The diagnosis of a speculative lever: gain per level with its interval, acceptance, where the gain ends against the
roofline's break-even, greedy outputs; the pure parts by hand, the whole finding from a constructed store."""

import math
import random

import pytest

from rooftop.bench.engine_metrics import spec_figures
from rooftop.campaign.collect import COMPARISON, collect
from rooftop.campaign.diagnosis import diagnose
from rooftop.campaign.evidence import LevelEffect
from rooftop.campaign.quality import GreedyOutput, compare_outputs
from rooftop.campaign.speculative_rules import (
    BreakEven,
    break_even,
    end_against_roofline,
    gain_text,
    measured_end,
    predicted_gain,
)
from rooftop.campaign.store import Store


def effect(c: int, ratio: float, low: float, high: float) -> LevelEffect:
    verdict = "faster" if low > 1 else "slower" if high < 1 else "no difference within noise"
    return LevelEffect(c, "output_tok_s", 100.0, 100.0 * ratio, ratio, low, high, verdict, 3, 3)


def test_the_gain_and_where_it_ends_are_read_from_the_intervals():
    effects = [effect(1, 1.38, 1.30, 1.46), effect(4, 1.15, 1.05, 1.25), effect(8, 1.02, 0.97, 1.07),
               effect(16, 0.99, 0.95, 1.03)]
    assert gain_text(effects[0]) == "+38% tok/s at C=1 [+30, +46]"
    assert gain_text(effects[2]) == "+2% tok/s at C=8 [-3, +7] (no gain)"
    assert gain_text(effect(2, 0.8, 0.7, 0.9)) == "-20% tok/s at C=2 [-30, -10] (slower)"
    assert measured_end(effects) == (4, 8)
    # a level within noise between two gains does not end it: the gain ends where no later level gains
    assert measured_end([effect(1, 1.3, 1.2, 1.4), effect(4, 1.1, 0.95, 1.2), effect(8, 1.2, 1.1, 1.3)]) == (8, None)
    assert measured_end([effect(1, 1.0, 0.9, 1.1), effect(4, 0.9, 0.85, 0.95)]) == (None, 1)


def test_the_roofline_prices_the_measured_acceptance_and_its_break_even():
    step = {"batch": 8, "plain_ms": 1.0, "verify_ms": 1.5, "draft_ms": 0.5}
    assert predicted_gain(step, 3.0) == pytest.approx(1.5)  # 3 tokens a verify, for 2 ms against 3 x 1 ms
    # gains 2.0 at 8 and 0.5 at 32: log-linear between them, 1 is reached a third of the way, B = 8 x 4^(2/3)
    assert break_even({1: 3.0, 8: 2.0, 32: 0.5}) == BreakEven(pytest.approx(8 * 4 ** (2 / 3)), "at")
    assert break_even({1: 0.9, 8: 0.5}) == BreakEven(1, "never")
    assert break_even({1: 3.0, 1024: 1.2}) == BreakEven(1024, "beyond")
    assert break_even({}) is None
    at = BreakEven(24.0, "at")
    assert end_against_roofline(4, 8, 16, at) == "earlier"  # gone by C=8, the roofline still pays to B=24
    assert end_against_roofline(16, 32, 64, at) == "as predicted"
    assert end_against_roofline(32, 64, 64, at) == "later"
    assert end_against_roofline(64, None, 64, at) == "later"  # still paying past the roofline's break-even
    assert end_against_roofline(16, None, 16, at) == "as predicted"
    assert end_against_roofline(None, 1, 16, BreakEven(1, "never")) == "as predicted"
    assert end_against_roofline(4, 8, 16, BreakEven(1024, "beyond")) == "earlier"
    assert end_against_roofline(4, 8, 16, None) == ""


SPEC_TOML = """
[campaign]
name = "spec"
mode = "independent"
[model]
preset = "small"
[hardware]
gpu = "h200"
[deployment]
engine = "embedded"
[bench]
concurrency = [1, 4, 8, 16]
repeats = 3
[[lever]]
name = "ngram"
hypothesis = "drafting from the prompt raises tok/s where decode is memory-bound"
speculative = { method = "ngram", num_speculative_tokens = 3 }
"""
TOK_S = {"baseline": {1: 100.0, 4: 300.0, 8: 500.0, 16: 700.0},
         "ngram": {1: 138.0, 4: 345.0, 8: 510.0, 16: 690.0}}
# the roofline's floors (ms) at each batch priced: verify of 4 tokens a sequence (compute-bound from B=20, so it
# grows faster than plain decode's), no draft time (ngram)
FLOORS = {"method": "ngram", "k": 3, "draft": "ngram", "draft_modelled": True, "hardware": "h200", "context": 288,
          "verify_compute_bound_batch": 20, "plain_compute_bound_batch": None, "notes": [],
          "steps": [{"batch": b, "plain_ms": p, "verify_ms": v, "draft_ms": 0.0} for b, p, v in (
              (1, 0.27, 0.46), (2, 0.34, 0.61), (4, 0.46, 0.76), (8, 0.62, 0.84), (16, 0.78, 1.5),
              (32, 0.88, 2.4), (64, 0.96, 4.4), (128, 1.09, 8.4))]}


def level(c: int, tok_s: float, spec: dict | None) -> dict:
    out = {"concurrency": c, "valid": True, "completed": 32, "failed": 0,
           "output_tok_s": {"mean": tok_s, "ci_low": tok_s, "ci_high": tok_s, "per_repeat": [tok_s]},
           "ttft_ms": {"mean": 20.0}, "tpot_ms": {"mean": 1000.0 * c / tok_s}}
    if spec:
        out["spec_decode"] = spec | {"repeats": 1, "source": "vllm:spec_decode_*"}
    return out


def populate(run_dir, divergent: bool = False, engine_reports: bool = True, roofline: bool = True) -> Store:
    rng = random.Random(3)
    store = Store.create(run_dir)
    store.put_run("spec", "", "independent", SPEC_TOML, "spec.toml", {"cpus": 2})
    store.put_decision(COMPARISON, "ngram", {"lever": "ngram", "variant": "ngram", "base_variant": "baseline",
                                             "series": "main"})
    for r in range(3):
        for v, levels in TOK_S.items():
            for c, mean in levels.items():
                # per position: 600, 420, 300 of 1000 drafts accepted -> rate 0.44, mean accepted length 2.32
                spec = spec_figures(1000, 3000, 1320, [600, 420, 300]) if v == "ngram" and engine_reports else None
                store.put_level("main", v, r, c, level(c, mean * rng.uniform(0.98, 1.02), spec), True)
    if roofline:
        store.put_analysis("ngram", "speculative_roofline", FLOORS)
    else:
        store.put_analysis("ngram", "speculative_roofline_missing", {"reason": "no config.json for model '/m'"})
    top = {" the": -0.9, " a": -1.0}  # 0.1 nats apart: a near-tie
    far = {" the": -0.1, " a": -2.5}
    same = GreedyOutput("p", ["x", "y"], [{"x": -0.1}, {"y": -0.1}])
    base = [same, same, GreedyOutput("q", ["x", " the"], [{"x": -0.1}, far if divergent else top])]
    lever = [same, same, GreedyOutput("q", ["x", " a"], [{"x": -0.1}, far if divergent else top])]
    store.put_analysis("ngram", "quality", compare_outputs(base, lever, 0.05, 0.5, 0.2, must_match=True).to_dict())
    return store


def test_a_speculative_lever_is_diagnosed_against_its_roofline(tmp_path):
    ev = collect(populate(tmp_path / "run"))
    lvl = ev.variants["ngram"].level(8)
    assert lvl.spec_decode["acceptance_rate"] == pytest.approx(0.44)
    assert lvl.spec_decode["mean_accepted_length"] == pytest.approx(2.32)  # 1 + 3960 accepted / 3000 drafts
    assert lvl.spec_decode["acceptance_by_position"] == pytest.approx([0.6, 0.42, 0.3])
    diagnosis = diagnose(ev)
    (f,) = [f for f in diagnosis.findings if f.rule == "speculative"]
    assert not [g for g in diagnosis.findings if g.rule == "lever"]  # the generic lever rule leaves it alone
    n = f.numbers
    assert (n["last_gain"], n["gain_ends_at"]) == (4, 8)
    assert [n["levels"][c]["verdict"] for c in (1, 4, 8, 16)] == ["faster", "faster", "no difference within noise",
                                                                   "no difference within noise"]
    # the roofline at E = 2.32: 0.78 x 2.32 / 1.5 = 1.21 at B=16, 0.88 x 2.32 / 2.4 = 0.85 at 32: break-even between
    g16, g32 = 0.78 * 2.32 / 1.5, 0.88 * 2.32 / 2.4
    assert n["predicted_gain"][16] == pytest.approx(g16)
    assert n["break_even"] == "at"
    assert n["break_even_batch"] == pytest.approx(16 * 2 ** ((g16 - 1) / (g16 - g32)))  # 24.0
    assert n["end_vs_roofline"] == "earlier"  # no gain from C=8 on, where the roofline still gives 1.74
    assert f.gain_kind == "measured" and f.expected_gain == pytest.approx(n["levels"][1]["ratio"])
    assert f.title == "Speculative decoding (ngram, k=3): faster up to C=4, no gain from C=8"
    s = f.sentence
    r1 = n["levels"][1]
    assert s.startswith(f"Lever ngram (speculative ngram, k=3): {(r1['ratio'] - 1) * 100:+.0f}% tok/s at C=1 "
                        f"[{(r1['low'] - 1) * 100:+.0f}, {(r1['high'] - 1) * 100:+.0f}], ")
    assert "(no gain), " in s and "acceptance 0.44, mean accepted length 2.3" in s
    assert "acceptance 0.44, mean accepted length 2.3 (so at most ×2.32 at any level: a bound)" in s
    assert ("the roofline, its floors priced at that acceptance, gives ×1.36 at C=1, ×1.40 at C=4, ×1.71 at C=8, "
            "×1.21 at C=16 and puts the break-even at B≈24 (its verify step of 4 tokens a sequence turns "
            "compute-bound at B=20)") in s
    assert "the gain ends between C=4 and C=8, earlier than the roofline predicts" in s
    assert ("greedy outputs identical on 2 of 3 prompts, 1 parting at a near-tie (first prompt 3 at token 2: ' the' "
            "vs ' a', the baseline's top-2 gap 0.1 nats)") in s
    assert math.isfinite(r1["low"]) and r1["low"] > 1


def test_a_divergence_beyond_a_near_tie_flags_the_lever(tmp_path):
    (f,) = [f for f in diagnose(collect(populate(tmp_path / "run", divergent=True))).findings
            if f.rule == "speculative"]
    assert f.title.endswith("(quality flagged)") and f.numbers["quality_flagged"]
    assert ("quality flagged: greedy outputs part at 1 of 3 prompts (1 beyond a near-tie; first prompt 3 at token 2: "
            "' the' vs ' a', the baseline's top-2 gap 2.4 nats (> 0.2))") in f.sentence


def test_without_the_engines_figures_or_a_roofline_it_says_so(tmp_path):
    (f,) = [f for f in diagnose(collect(populate(tmp_path / "a", engine_reports=False))).findings
            if f.rule == "speculative"]
    assert ("; acceptance not reported (the engine's /metrics had no speculative-decoding figures); the roofline's "
            "floors are not priced: the engine reported no acceptance; the gain ends between C=4 and C=8; ") in f.sentence
    assert "at most" not in f.sentence and "end_vs_roofline" not in f.numbers
    (f,) = [f for f in diagnose(collect(populate(tmp_path / "b", roofline=False))).findings if f.rule == "speculative"]
    assert ("; no roofline of the verify step (no config.json for model '/m'); the gain ends between C=4 and C=8; "
            in f.sentence)
