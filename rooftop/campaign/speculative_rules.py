"""What a speculative-decoding lever did: its tok/s gain at each level with the interval, the drafts' acceptance, where
the gain ends against where the roofline puts speculation's break-even, and whether greedy outputs held.

The comparison is pure: `predicted_gains` prices the stored verify and draft floors (campaign/speculative_floors.py)
at the acceptance the lever measured (mean accepted length E: a verify step yields E tokens a sequence), the gain at
batch B being plain step x E / (verify step + draft); `break_even` is the batch where that falls to 1; `measured_end`
is the first level from which no level gains beyond noise (the tok/s ratio's interval reaches 1); `end_against_roofline`
says whether the gain ended earlier, where, or later than the roofline's break-even. A concurrency level is taken as a
batch of that many sequences. The roofline's gains are floors' ratios: a bound on what speculation can give, not a
measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rooftop.campaign.evidence import Evidence, Finding, LevelEffect, LeverEvidence
from rooftop.campaign.quality import Divergence, divergence_text
from rooftop.spec.speculative import Speculative


@dataclass(slots=True)
class BreakEven:
    """Where the roofline's gain falls to 1 at an acceptance: `batch` (interpolated between the batches priced);
    `how`: "at" (it does, at `batch`), "never" (no gain even at batch 1), "beyond" (still a gain at `batch`, the
    largest priced)."""

    batch: float
    how: str


def pct(ratio: float) -> str:
    """A ratio as a signed percentage: 1.38 -> '+38%', 0.97 -> '-3%'."""
    return f"{(ratio - 1) * 100:+.0f}%"


def gain_text(e: LevelEffect) -> str:
    """'+38% tok/s at C=1 [+30, +46]', with '(no gain)' or '(slower)' where the interval says so."""
    interval = ""
    if math.isfinite(e.ratio_low) and math.isfinite(e.ratio_high):
        interval = f" [{(e.ratio_low - 1) * 100:+.0f}, {(e.ratio_high - 1) * 100:+.0f}]"
    elif min(e.n_baseline, e.n_candidate) < 2:
        interval = " (one repeat: no interval)"
    verdict = {"faster": "", "slower": " (slower)"}.get(e.verdict, " (no gain)")
    return f"{pct(e.ratio)} tok/s at {e.at}{interval}{verdict}"


def measured_end(effects: list[LevelEffect]) -> tuple[int | None, int | None]:
    """(the last level that gains beyond noise before the gain ends, the first level from which none does), over the
    tok/s effects in level order: (None, first) where no level gains, (top, None) where the gain holds to the top."""
    ordered = sorted(effects, key=lambda e: e.concurrency)
    if not ordered:
        return None, None
    end = len(ordered)
    while end > 0 and ordered[end - 1].verdict != "faster":
        end -= 1
    if end == len(ordered):
        return ordered[-1].concurrency, None
    return (ordered[end - 1].concurrency if end else None), ordered[end].concurrency


def predicted_gain(step: dict, accepted_length: float) -> float:
    """The roofline's gain at one batch: plain step x E over (verify step + draft), E tokens a verify yields."""
    return step["plain_ms"] * accepted_length / (step["verify_ms"] + step["draft_ms"])


def predicted_gains(steps: list[dict], accepted_length: float) -> dict[int, float]:
    """The roofline's gain at every batch priced, at mean accepted length E."""
    return {int(s["batch"]): predicted_gain(s, accepted_length) for s in steps}


def break_even(gains: dict[int, float]) -> BreakEven | None:
    """Where the roofline's gains (batch -> gain) fall to 1: interpolated in log batch between the last batch that
    gains and the first that does not; None without any batch priced."""
    batches = sorted(gains)
    if not batches:
        return None
    first = next((i for i, b in enumerate(batches) if gains[b] <= 1.0), None)
    if first is None:
        return BreakEven(batches[-1], "beyond")
    if first == 0:
        return BreakEven(batches[0], "never")
    b0, b1 = batches[first - 1], batches[first]
    g0, g1 = gains[b0], gains[b1]
    t = (g0 - 1.0) / (g0 - g1) if g0 != g1 else 1.0
    return BreakEven(2 ** (math.log2(b0) + t * (math.log2(b1) - math.log2(b0))), "at")


def end_against_roofline(last_gain: int | None, ends_at: int | None, top: int, predicted: BreakEven | None) -> str:
    """'earlier', 'as predicted' or 'later': where the measured gain ends (between `last_gain` and `ends_at`, the
    levels of measured_end; `top` the highest level) against the roofline's break-even; '' where it cannot say."""
    if predicted is None or (last_gain is None and ends_at is None):
        return ""
    if predicted.how == "never":
        return "as predicted" if last_gain is None else "later"
    if ends_at is None:  # the gain holds through the top level
        return "later" if predicted.how == "at" and predicted.batch <= top else "as predicted"
    if predicted.how == "beyond" or predicted.batch > ends_at:
        return "earlier"
    low = last_gain if last_gain is not None else 0
    return "as predicted" if predicted.batch > low else "later"


def accepted(ev: Evidence, variant: str) -> list[tuple[str, dict]]:
    """(level name, its spec_decode figures) of each level of `variant` where the engine reported speculation."""
    v = ev.variants.get(variant)
    return [(lvl.at, lvl.spec_decode) for lvl in (v.levels if v else []) if lvl.spec_decode]


def acceptance_text(levels: list[tuple[str, dict]]) -> str:
    """'acceptance 0.62, mean accepted length 2.9' (one figure where the levels agree within 0.02, else per level);
    '' where none was reported."""
    rates = [(at, d.get("acceptance_rate"), d.get("mean_accepted_length")) for at, d in levels]
    if not rates:
        return ""
    known = [r for r in rates if r[1] is not None]
    lengths = [r for r in rates if r[2] is not None]
    parts = []
    if known:
        values = [r[1] for r in known]
        parts.append(f"acceptance {sum(values) / len(values):.2f}" if max(values) - min(values) < 0.02 else
                     "acceptance " + ", ".join(f"{r:.2f} at {at}" for at, r, _ in known))
    if lengths:
        values = [r[2] for r in lengths]
        parts.append(f"mean accepted length {sum(values) / len(values):.1f}" if max(values) - min(values) < 0.05
                     else "mean accepted length " + ", ".join(f"{n:.1f} at {at}" for at, _, n in lengths))
    return ", ".join(parts)


def end_text(last_gain: int | None, ends_at: int | None, verdict: str, names: dict[int, str]) -> str:
    """'the gain ends between C=4 and C=8, earlier than the roofline predicts' (the measured end, and how it compares
    where there is a roofline; `names`: each level's name); '' where no level gained."""
    if ends_at is not None:
        where = (f"the gain ends between {names[last_gain]} and {names[ends_at]}" if last_gain is not None else
                 f"no gain from {names[ends_at]} on")
    else:
        where = f"the gain holds through {names[last_gain]}" if last_gain is not None else ""
    said = {"earlier": "earlier than the roofline predicts", "later": "later than the roofline predicts",
            "as predicted": "where the roofline predicts"}.get(verdict, "")
    return f"{where}, {said}" if where and said else where


def roofline_text(floors: dict, at_levels: dict[int, float], predicted: BreakEven | None) -> str:
    """The roofline's side: its floors priced at the measured acceptance at each level, its break-even, and the batch
    where its verify step turns compute-bound."""
    text = ("the roofline, its floors priced at that acceptance" + (
        "" if floors.get("draft_modelled", True) else f" (the {floors['method']} draft's time not counted)")
        + ", gives " + ", ".join(f"×{g:.2f} at C={c}" for c, g in sorted(at_levels.items())))
    if predicted is not None:
        text += {"never": " and no gain at any batch",
                 "beyond": f" and no break-even up to B={predicted.batch:.0f}"}.get(
            predicted.how, f" and puts the break-even at B≈{predicted.batch:.0f}")
    if floors.get("verify_compute_bound_batch"):
        text += (f" (its verify step of {floors['k'] + 1} tokens a sequence turns compute-bound at "
                 f"B={floors['verify_compute_bound_batch']})")
    return text


def quality_text(q: dict | None) -> str:
    """The greedy-output check of a speculative lever, in a clause."""
    if not q:
        return "greedy outputs not checked"
    divs = [Divergence(**d) for d in q.get("divergences") or []]
    prompts = q.get("prompts")
    if q.get("flagged"):
        return f"quality flagged: {q.get('reason')}"
    if not divs:
        return f"greedy outputs identical on all {prompts} prompts"
    ties = [d for d in divs if d.kind == "near-tie"]
    return (f"greedy outputs identical on {prompts - len(divs)} of {prompts} prompts, {len(ties)} parting at a "
            f"near-tie (first {divergence_text(ties[0])})" if ties else
            f"greedy outputs part at {len(divs)} of {prompts} prompts (first {divergence_text(divs[0])})")


def roofline_clause(ev: Evidence, lv: LeverEvidence, effects: list[LevelEffect], lengths: list[float],
                    last_gain: int | None, ends_at: int | None) -> tuple[str, str, dict]:
    """(the roofline's clause, how the measured end compares with its break-even, the figures): the stored floors
    priced at each level's mean accepted length (the levels' mean where a level reported none)."""
    floors = ev.speculative_rooflines.get(lv.variant)
    if floors is None:
        why = ev.missing.get(f"speculative_roofline:{lv.variant}")
        return "no roofline of the verify step" + (f" ({why})" if why else ""), "", {}
    if not lengths:
        return "the roofline's floors are not priced: the engine reported no acceptance", "", {}
    if any(e.label for e in effects):
        return "no roofline comparison: open-loop levels are not batches of a known size", "", {}
    mean_length = sum(lengths) / len(lengths)
    by_level = {lvl.concurrency: lvl.spec_decode["mean_accepted_length"] for lvl in ev.variants[lv.variant].levels
                if lvl.spec_decode and lvl.spec_decode.get("mean_accepted_length") is not None}
    steps = {int(st["batch"]): st for st in floors["steps"]}
    at_levels = {e.concurrency: predicted_gain(steps[e.concurrency], by_level.get(e.concurrency, mean_length))
                 for e in effects if e.concurrency in steps}
    predicted = break_even(predicted_gains(floors["steps"], mean_length))
    verdict = end_against_roofline(last_gain, ends_at, effects[-1].concurrency, predicted)
    return roofline_text(floors, at_levels, predicted), verdict, {
        "predicted_gain": at_levels, "break_even_batch": predicted.batch if predicted else None,
        "break_even": predicted.how if predicted else None, "end_vs_roofline": verdict,
        "verify_compute_bound_batch": floors.get("verify_compute_bound_batch")}


def speculative_finding(ev: Evidence, lv: LeverEvidence) -> Finding | None:
    """One lever that sets `speculative`: its gain per level, acceptance, where the gain ends against the roofline,
    its quality; None where no tok/s effect was measured."""
    s = Speculative(**lv.changes["speculative"])
    effects = sorted((e for e in lv.effects if e.metric == "output_tok_s"), key=lambda e: e.concurrency)
    if not effects:
        return None
    last_gain, ends_at = measured_end(effects)
    levels = accepted(ev, lv.variant)
    lengths = [d["mean_accepted_length"] for _, d in levels if d.get("mean_accepted_length") is not None]
    sentence = f"Lever {lv.name} (speculative {s.label()}): " + ", ".join(gain_text(e) for e in effects)
    sentence += "; " + (acceptance_text(levels) or "acceptance not reported (the engine's /metrics had no "
                        "speculative-decoding figures)")
    if lengths:  # a verify step is no faster than a decode step, so it cannot gain more than the tokens it yields
        sentence += f" (so at most ×{max(lengths):.2f} at any level: a bound)"
    numbers: dict = {"lever": lv.name, "method": s.method, "k": s.num_speculative_tokens,
                     "levels": {e.concurrency: {"ratio": e.ratio, "low": e.ratio_low, "high": e.ratio_high,
                                                "verdict": e.verdict} for e in effects},
                     "last_gain": last_gain, "gain_ends_at": ends_at,
                     "acceptance": {at: d.get("acceptance_rate") for at, d in levels},
                     "mean_accepted_length": {at: d.get("mean_accepted_length") for at, d in levels}}
    clause, verdict, priced = roofline_clause(ev, lv, effects, lengths, last_gain, ends_at)
    sentence += "; " + clause
    numbers.update(priced)
    names = {e.concurrency: e.at for e in effects}
    end = end_text(last_gain, ends_at, verdict, names)
    sentence += (f"; {end}" if end else "") + "; " + quality_text(lv.quality)
    gained = [e for e in effects if e.verdict == "faster"]
    best = max(gained, key=lambda e: e.ratio) if gained else None
    title = f"Speculative decoding ({s.label()}): " + (
        "no gain at any level" if last_gain is None else f"faster through {names[last_gain]}" if ends_at is None
        else f"faster up to {names[last_gain]}, no gain from {names[ends_at]}")
    if lv.quality and lv.quality.get("flagged"):
        title += " (quality flagged)"
        numbers["quality_flagged"] = True
    return Finding(title, sentence + ".", numbers, f"levels {lv.variant} vs {lv.base_variant}",
                   best.ratio if best else None, "speculative", "measured" if best else "")


def speculative_findings(ev: Evidence, cited: set[str]) -> list[Finding]:
    """A finding for each lever that sets `speculative` (added to `cited`, so the generic lever rule skips it)."""
    out = []
    for lv in ev.levers:
        if lv.name in cited or "speculative" not in lv.changes:
            continue
        finding = speculative_finding(ev, lv)
        if finding is not None:
            cited.add(lv.name)
            out.append(finding)
    return out
