"""The knee finding says 'stops scaling' only when the next level does not still gain on the means."""

from rooftop.campaign.diagnosis import rule_knee
from rooftop.campaign.evidence import Evidence, LevelStat, VariantEvidence


def evidence(top_tok_s: float, top_interval: tuple[float, float]) -> Evidence:
    levels = [LevelStat(1, 70.0, 65.0, 75.0, 60.0, 9.0, 3, True),
              LevelStat(4, top_tok_s, *top_interval, 400.0, 12.0, 3, True)]
    base = VariantEvidence("baseline", [], "single", levels, knee_concurrency=1)
    return Evidence("c", "g", "independent", "baseline", {"baseline": base}, [])


def test_a_noisy_climb_is_reported_as_unclear_not_as_a_knee():
    (f,) = rule_knee(evidence(150.0, (-150.0, 330.0)))
    assert f.title == "Knee unclear: too noisy to place"
    assert "+114%" in f.sentence and "stops scaling" not in f.sentence


def test_a_flat_next_level_is_a_knee():
    (f,) = rule_knee(evidence(72.0, (66.0, 78.0)))
    assert f.title == "Knee at C=1" and "stops scaling at C=1" in f.sentence
