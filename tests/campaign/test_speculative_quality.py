"""Greedy outputs of a speculative lever against its base's, token for token: each prompt's first divergence with
the baseline's top-2 logprob gap there, a near-tie within the margin, a verification bug beyond it."""

import pytest

from rooftop.campaign.plan import Block
from rooftop.campaign.quality import GreedyOutput, compare_outputs, first_divergences
from rooftop.campaign.quality_stage import must_match
from rooftop.campaign.stage_context import StageContext
from rooftop.report.fmt import redact
from rooftop.spec.campaign import parse_campaign

X = {"x": -0.1, "y": -3.0}  # a position where both sides agree


def out(tokens: list[str], tops: list[dict]) -> GreedyOutput:
    return GreedyOutput("p", tokens, tops)


def test_first_divergence_and_the_baselines_gap_there():
    tie = {" the": -1.00, " a": -1.05, " an": -4.0}  # the base's pick 0.05 nats ahead of the lever's
    far = {" the": -0.2, " a": -1.5, " an": -4.0}  # 1.3 nats ahead
    base = [out(["x", " the", "x"], [X, tie, X]), out(["x", " the", "x"], [X, far, X]),
            out(["x", "x"], [X, X]), out(["x", " the"], [X, far])]
    lever = [out(["x", " a", "y"], [X, tie, X]), out(["x", " a", "x"], [X, far, X]),
             out(["x", "x"], [X, X]), out(["x", " zz"], [X, far])]
    divs = first_divergences(base, lever, margin=0.2)
    assert [(d.prompt, d.position, d.base_pick, d.lever_pick, d.kind) for d in divs] == [
        (0, 1, " the", " a", "near-tie"), (1, 1, " the", " a", "bug"), (3, 1, " the", " zz", "bug")]
    assert divs[0].top2_gap == pytest.approx(0.05) and divs[1].top2_gap == pytest.approx(1.3)
    # ' zz' is not in the base's top list: the gap to it is at least the base's pick over the last one shown
    assert divs[2].gap_is_bound and divs[2].gap == pytest.approx(3.8)


def test_a_speculative_lever_is_flagged_only_beyond_a_near_tie():
    tie = {" the": -1.00, " a": -1.05}
    far = {" the": -0.2, " a": -1.5}
    same = out(["x", "x", "x", "x"], [X, X, X, X])
    near = (out(["x", " the", "x", "x"], [X, tie, X, X]), out(["x", " a", "y", "y"], [X, tie, X, X]))
    # 7 identical prompts and one near-tie: agreement 7.25/8 < 0.9 would flag a plain lever without the tie margin;
    # a speculative one passes, and says where it parted
    r = compare_outputs([same] * 7 + [near[0]], [same] * 7 + [near[1]], 0.05, 0.9, 0.2, must_match=True)
    assert not r.flagged and r.must_match
    assert "1 of 8 prompts part, each at a near-tie (≤ 0.2 nats)" in r.reason
    assert [d.kind for d in r.divergences] == ["near-tie"]
    bug = (out(["x", " the", "x", "x"], [X, far, X, X]), out(["x", " a", "x", "x"], [X, far, X, X]))
    r = compare_outputs([same] * 7 + [bug[0]], [same] * 7 + [bug[1]], 0.05, 0.5, 0.2, must_match=True)
    assert r.flagged and r.divergences[0].kind == "bug"
    assert r.reason.startswith("greedy outputs part at 1 of 8 prompts (1 beyond a near-tie; first prompt 8 at token "
                               "2: ' the' vs ' a', the baseline's top-2 gap 1.3 nats (> 0.2)): speculation must not "
                               "change greedy outputs")
    # results.json redacts keys named like secrets ("token"): the picks survive it
    assert redact(r.to_dict())["divergences"][0] | {} == r.to_dict()["divergences"][0]
    # the same parting on a lever that may change outputs (a quantisation, say) is judged by the thresholds alone
    plain = compare_outputs([same] * 7 + [bug[0]], [same] * 7 + [bug[1]], 0.05, 0.5, 0.2)
    assert not plain.flagged and not plain.must_match and plain.divergences[0].kind == "bug"


def test_without_logprobs_a_divergence_cannot_pass_as_a_near_tie():
    base, lever = GreedyOutput("p", ["a", "b"], None), GreedyOutput("p", ["a", "c"], None)
    r = compare_outputs([base] * 3, [base, base, lever], 0.05, 0.5, 0.2, must_match=True)
    assert r.flagged and r.divergences[0].kind == "unknown" and r.divergences[0].top2_gap is None
    assert "1 with no logprobs to tell from a near-tie; first prompt 3 at token 2: 'b' vs 'c', no logprobs there" \
        in r.reason
    ended = compare_outputs([out(["x", "x"], [X, X])], [out(["x"], [X])], 0.05, 0.0, 0.2, must_match=True)
    assert ended.divergences[0].lever_pick is None and ended.divergences[0].kind == "bug"  # X's top-2 gap: 2.9
    assert "'x' vs its end" in ended.reason


def test_the_stage_holds_only_a_speculative_lever_to_exact_greedy_outputs():
    spec = parse_campaign('[campaign]\nname = "c"\n[model]\npreset = "tiny"\n[deployment]\nengine = "embedded"\n'
                          '[[lever]]\nname = "ngram"\nspeculative = { method = "ngram", num_speculative_tokens = 3 }\n'
                          '[[lever]]\nname = "cap"\nargs = { context-length = 4096 }\nquality_check = true\n')
    ctx = StageContext(spec=spec, store=None, say=print, stage=print)
    assert must_match(ctx, Block("ngram", ["ngram"], "main", 0, True, "baseline"))
    assert must_match(ctx, Block("baseline+cap+ngram", ["cap", "ngram"], "ngram", 0, True, "baseline+cap"))
    assert not must_match(ctx, Block("cap", ["cap"], "main", 0, True, "baseline"))
    assert not must_match(ctx, Block("baseline", [], "main", 0, True, None))
