"""Quality comparison: agreement over the common prefix, KL on top-k logprobs, flags past thresholds."""

import math

import pytest

from rooftop.campaign.quality import GreedyOutput, compare_outputs, kl_top


def test_identical_outputs_agree_with_zero_kl():
    lp = [{"a": math.log(0.7), "b": math.log(0.2)}, {"c": math.log(0.9), "d": math.log(0.05)}]
    base = [GreedyOutput("p", ["a", "c"], lp)]
    r = compare_outputs(base, [GreedyOutput("p", ["a", "c"], lp)], kl_threshold=0.05, agreement_threshold=0.9)
    assert r.agreement == 1.0 and r.exact_match == 1.0 and r.mean_kl == pytest.approx(0.0, abs=1e-12)
    assert not r.flagged and r.kl_positions == 2


def test_divergence_is_flagged_and_kl_matches_hand_computation():
    p = {"a": math.log(0.6), "b": math.log(0.4)}
    q = {"a": math.log(0.4), "b": math.log(0.6)}
    expected = 0.6 * math.log(0.6 / 0.4) + 0.4 * math.log(0.4 / 0.6)
    assert kl_top(p, q) == pytest.approx(expected)
    base = [GreedyOutput("x", ["a", "b", "c", "d"], [p, p, p, p]), GreedyOutput("y", ["z"], None)]
    cand = [GreedyOutput("x", ["a", "b", "x", "y"], [q, q, q, q]), GreedyOutput("y", ["z"], None)]
    r = compare_outputs(base, cand, kl_threshold=0.05, agreement_threshold=0.9)
    assert r.agreement == pytest.approx((2 / 4 + 1.0) / 2)
    assert r.exact_match == 0.5
    # KL is taken over the common prefix and the first diverging position: 3 positions of prompt x.
    assert r.kl_positions == 3 and r.mean_kl == pytest.approx(expected)
    assert r.flagged and "agreement 75%" in r.reason and "mean KL" in r.reason


def test_missing_token_in_candidate_top_k_uses_its_floor():
    p = {"a": math.log(0.5), "b": math.log(0.5)}
    q = {"a": math.log(0.9), "c": math.log(0.05)}  # b not shown: at most 0.05
    k = kl_top(p, q)
    zq = 0.9 + 0.05
    assert k == pytest.approx(0.5 * math.log(0.5 / (0.9 / zq)) + 0.5 * math.log(0.5 / (0.05 / zq)))


def test_partings_at_near_ties_count_as_agreeing_for_the_flag():
    """Seen on the H200 demo: indexer-actual vs the capacity-bound baseline parted at ties like
    'h' -3.074 vs 'F' -3.097 (0.02 nats) on the random-weight model, KL 0.001: rounding, not quality."""
    tie_b = {"h": -3.0737, "F": -3.0972, "9": -3.0972}  # the base's pick 0.02 nats ahead
    tie_c = {"F": -2.9081, "h": -3.0565, "9": -3.1112}  # the lever's 0.15 ahead
    far = {"h": -1.0, "F": -3.0}
    same = GreedyOutput("b", ["x", "h", "q"], [{"x": -0.1}, far, {"q": -0.1}])

    def pair(base_top, lever_top):
        return (GreedyOutput("a", ["x", "h", "q"], [{"x": -0.1}, base_top, {"q": -0.1}]),
                GreedyOutput("a", ["x", "F", "r"], [{"x": -0.1}, lever_top, {"r": -0.1}]))

    b, c = pair(tie_b, tie_c)
    r = compare_outputs([b, same], [c, same], kl_threshold=0.05, agreement_threshold=0.9, tie_margin=0.2)
    assert r.agreement == pytest.approx((1 / 3 + 1) / 2) and r.tie_flips == 1
    assert r.agreement_ties_as_agreeing == 1.0 and not r.flagged
    assert "1 of 2 prompts part at near-ties" in r.reason
    # With no margin (the rule before) the same parting is flagged.
    r = compare_outputs([b, same], [c, same], 0.05, 0.9)
    assert r.flagged and r.tie_flips == 0 and "agreement 67%" in r.reason
    # Not a tie: the base preferred its own token by 2 nats.
    b2, c2 = pair(far, tie_c)
    assert compare_outputs([b2, same], [c2, same], 0.05, 0.9, 0.2).tie_flips == 0
    # Not a tie: the lever preferred its own token by 2 nats, though the base was torn.
    b3, c3 = pair(tie_b, {"F": -1.0, "h": -3.0})
    assert compare_outputs([b3, same], [c3, same], 0.05, 0.9, 0.2).tie_flips == 0
    # Not a tie: both torn between the two, but the distributions there differ (a third token moved).
    b4, c4 = pair(tie_b, {"F": -3.0, "h": -3.1, "9": -0.2})
    assert compare_outputs([b4, same], [c4, same], 0.05, 0.9, 0.2).tie_flips == 0


def test_empty_outputs_on_both_sides_agree():
    r = compare_outputs([GreedyOutput("p", [], None)], [GreedyOutput("p", [], None)], 0.05, 0.9, 0.2)
    assert r.agreement == 1.0 and r.exact_match == 1.0 and not r.flagged
