"""What the campaign decides between blocks: which variant each lever is measured as, and in cumulative
mode whether a lever joins the baseline. Each decision is stored once and read back on resume."""

from __future__ import annotations

from collections.abc import Callable

from rooftop.bench.slo import Slo
from rooftop.campaign.collect import COMPARISON, JOINED, KEPT, slo_capacity
from rooftop.campaign.store import Store
from rooftop.campaign.verdicts import capacity_change, lever_effects, wins
from rooftop.spec.campaign import CampaignSpec


def record_comparison(store: Store, lever: str, variant: str, base: str, series: str) -> None:
    """Store that `lever` is measured as `variant` against `base` in `series`, unless it is stored already."""
    if not any(d.subject == lever for d in store.decisions(COMPARISON)):
        store.put_decision(COMPARISON, lever, {"lever": lever, "variant": variant, "base_variant": base,
                                               "series": series})


def decide(spec: CampaignSpec, store: Store, lever: str, base: str, cand: str, say: Callable[[str], None]) -> bool:
    """Cumulative mode: does the lever join the base? Decided once (and said), then read back on resume."""
    for d in store.decisions():
        if d.subject == lever and d.kind in (JOINED, KEPT):
            return d.kind == JOINED
    rows_b = store.levels(base, series=lever)
    rows_c = store.levels(cand, series=lever)
    effects = lever_effects(rows_b, rows_c, spec.bench.confidence, spec.campaign.seed)
    if not effects:
        return False  # nothing measured (failed blocks): undecided, not joined
    capacity = None
    if spec.slo is not None:  # a lever that lowers the SLO capacity stays out, however fast
        slo, conf = Slo(**spec.slo.model_dump()), spec.bench.confidence
        capacity = capacity_change(slo_capacity(rows_b, slo, conf), slo_capacity(rows_c, slo, conf))  # as SUMMARY
    won = wins(effects, capacity)
    tok = {e.concurrency: [round(e.ratio, 4), round(e.ratio_low, 4), round(e.ratio_high, 4), e.verdict]
           for e in effects if e.metric == "output_tok_s"}
    store.put_decision(JOINED if won else KEPT, lever, {"base": base, "variant": cand, "tok_s": tok,
                                                        **({"slo_capacity": capacity} if capacity else {})})
    say(f"[bold]{lever}[/]: {'joins the baseline' if won else 'stays out of the baseline'}")
    return won
