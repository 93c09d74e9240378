"""results.json: the workload, the evidence, the lever effects and the ranked findings, as data."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

from rooftop.campaign.completeness import DONE, Completeness
from rooftop.campaign.evidence import Diagnosis, Evidence
from rooftop.campaign.store import DeploymentRow
from rooftop.report.fmt import redact

SCHEMA = "rooftop.campaign.results/1"


def _clean(x):
    """NaN and infinities become null: JSON has no such numbers."""
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def render(ev: Evidence, dx: Diagnosis, units: dict[str, str], remaining: list[str], done: Completeness,
           deployments: list[DeploymentRow]) -> str:
    """The results.json text: complete only when every planned bring-up ran to its end; the bring-ups
    that did not (failed, interrupted, not run), and every bring-up's whole inventory and placement."""
    doc = {
        "schema": SCHEMA,
        "campaign": ev.campaign, "goal": ev.goal, "mode": ev.mode, "baseline": ev.baseline,
        "complete": done.complete, "remaining_units": remaining,
        "bring_ups": {"planned": len(done.blocks), "done": done.done,
                      "not_done": [asdict(b) for b in done.blocks if b.state != DONE]},
        "workload": asdict(ev.workload) if ev.workload is not None else None,
        "variants": {k: asdict(v) for k, v in ev.variants.items()},
        "levers": [asdict(lv) for lv in ev.levers],
        "profiles": {k: asdict(p) for k, p in ev.profiles.items()},
        "rooflines": {k: asdict(r) for k, r in ev.rooflines.items()},
        "findings": [asdict(f) for f in dx.findings],
        "binds_next": asdict(dx.binds_next) if dx.binds_next else None,
        "units": units,
        "deployments": [asdict(d) for d in deployments],
    }
    return json.dumps(_clean(redact(doc)), indent=2, sort_keys=False, default=str) + "\n"
