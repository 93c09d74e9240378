"""Lever verdicts: per concurrency level, the effect on tok/s, TTFT, TPOT (and goodput under an SLO)
with an interval.

The unit of replication is a repeat (one deployment, one sweep): repeats of A and B alternate in
time, so drift lands on both. Each repeat contributes one value per metric per level.
"""

from __future__ import annotations

import math

from rooftop.bench import stats
from rooftop.campaign.evidence import LevelEffect
from rooftop.campaign.store import LevelRow

# metric -> higher is better; goodput only where the campaign states an SLO (levels without it give none)
METRICS = {"output_tok_s": True, "ttft_ms": False, "tpot_ms": False, "goodput_req_s": True}


def repeat_value(summary: dict, metric: str) -> float | None:
    """One repeat's value of a metric from its level summary (bench summary.json level schema)."""
    v = summary.get(metric)
    if isinstance(v, dict):
        v = v.get("mean")
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return float(v)


def per_repeat(levels: list[LevelRow], metric: str) -> dict[int, list[float]]:
    """Per concurrency, the metric's value in each valid repeat, in repeat order."""
    out: dict[int, list[float]] = {}
    for row in sorted(levels, key=lambda r: (r.concurrency, r.repeat)):
        if not row.valid:
            continue
        v = repeat_value(row.summary, metric)
        if v is not None:
            out.setdefault(row.concurrency, []).append(v)
    return out


def lever_effects(base: list[LevelRow], candidate: list[LevelRow], confidence: float = 0.95,
                  seed: int = 0) -> list[LevelEffect]:
    """Effects of candidate against base at every concurrency level both measured validly."""
    effects = []
    for metric, higher_is_better in METRICS.items():
        b_by_c, c_by_c = per_repeat(base, metric), per_repeat(candidate, metric)
        for conc in sorted(set(b_by_c) & set(c_by_c)):
            b, c = b_by_c[conc], c_by_c[conc]
            e = stats.compare(b, c, confidence=confidence, higher_is_better=higher_is_better, seed=seed)
            effects.append(LevelEffect(
                concurrency=conc, metric=metric, baseline_mean=sum(b) / len(b), candidate_mean=sum(c) / len(c),
                ratio=e.ratio, ratio_low=e.ratio_low, ratio_high=e.ratio_high, verdict=e.verdict,
                n_baseline=len(b), n_candidate=len(c),
            ))
    return effects


def wins(effects: list[LevelEffect]) -> bool:
    """A lever wins (cumulative mode: joins the baseline) when tok/s is faster at some level and
    slower at none, and TPOT and goodput under the SLO (where there is one) are worse at none."""
    tok = [e.verdict for e in effects if e.metric == "output_tok_s"]
    worse = [e.verdict for e in effects if e.metric in ("tpot_ms", "goodput_req_s")]
    return "faster" in tok and "slower" not in tok and "slower" not in worse


def capacity_change(base: dict | None, candidate: dict | None) -> str:
    """Whether a lever moved the SLO capacity (bench.slo.SloCapacity dicts): "higher" or "lower" only when
    the two intervals do not overlap; an end outside the tested levels is open (below the lowest, or not
    reached above the highest)."""
    if not base or not candidate or not base.get("tested") or not candidate.get("tested"):
        return "not measured"

    def ends(c: dict) -> tuple[float, float, float]:
        load = c["load"] if c["load"] is not None else -math.inf
        if c["method"].startswith("single"):
            return load, load, load  # no interval: the point alone
        low = c["low"] if c["low"] is not None else -math.inf
        high = c["high"] if c["high"] is not None else (math.inf if not c["reached"] or c["load"] is not None
                                                         else -math.inf)
        return load, low, high

    (b, b_low, b_high), (c, c_low, c_high) = ends(base), ends(candidate)
    one = " (one repeat: no interval)" if base["method"].startswith("single") or \
        candidate["method"].startswith("single") else ""
    if c_low > b_high:
        return "higher" + one
    if c_high < b_low:
        return "lower" + one
    return ("same level" if c == b else "no difference within noise") + one
