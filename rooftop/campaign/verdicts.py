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


# Figures under the SLO: a failed request is one that missed it, so they come from every repeat that ran to
# its end, valid or not (a level invalid for failed requests lost goodput; leaving it out would hide that).
SLO_METRICS = ("goodput_req_s", "slo_attainment")


def ran_to_end(row: LevelRow) -> bool:
    """Whether a repeat's level ran to its end (not stopped early because the server went away); rows
    stored without the flag count when valid."""
    return not row.summary.get("stopped_early", not row.valid)


def per_repeat(levels: list[LevelRow], metric: str) -> dict[int, list[float]]:
    """Per concurrency, the metric's value in each valid repeat, in repeat order; for goodput and SLO
    attainment, in each repeat that ran to its end (SLO_METRICS)."""
    out: dict[int, list[float]] = {}
    keep = ran_to_end if metric in SLO_METRICS else (lambda row: row.valid)
    for row in sorted(levels, key=lambda r: (r.concurrency, r.repeat)):
        if not keep(row):
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
                n_baseline=len(b), n_candidate=len(c), label=level_label(base, conc),
            ))
    return effects


def level_label(rows: list[LevelRow], key: int) -> str:
    """The bench's name of the level stored under `key` where it is not 'C=key' (an open loop's), else ''."""
    label = next((r.summary.get("label") for r in rows if r.concurrency == key and r.summary.get("label")), None)
    return "" if label is None or label == f"C={key}" else label


def wins(effects: list[LevelEffect], capacity: str | None = None) -> bool:
    """A lever wins (cumulative mode: joins the baseline) when tok/s is faster at some level and
    slower at none, TPOT and goodput under the SLO (where there is one) are worse at none, and its
    SLO capacity (`capacity`: capacity_change(base's, lever's)) is not lower."""
    tok = [e.verdict for e in effects if e.metric == "output_tok_s"]
    worse = [e.verdict for e in effects if e.metric in ("tpot_ms", "goodput_req_s")]
    lower = capacity is not None and capacity.startswith("lower")
    return "faster" in tok and "slower" not in tok and "slower" not in worse and not lower


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
        high_open = c.get("high_open", not c["reached"] or c["load"] is not None)  # older dicts lack it
        high = c["high"] if c["high"] is not None else (math.inf if high_open else -math.inf)
        return load, low, high

    (b, b_low, b_high), (c, c_low, c_high) = ends(base), ends(candidate)
    one = " (one repeat: no interval)" if base["method"].startswith("single") or \
        candidate["method"].startswith("single") else ""
    if c_low > b_high:
        return "higher" + one
    if c_high < b_low:
        return "lower" + one
    return ("same level" if c == b else "no difference within noise") + one
