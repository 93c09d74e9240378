"""The roofline stage of a speculative variant stores its verify and draft floors beside the plain decode floor."""

import pytest

from rooftop.campaign.plan import Block
from rooftop.campaign.roofline_stage import run_roofline
from rooftop.campaign.stage_context import StageContext
from rooftop.campaign.store import Store
from rooftop.spec.campaign import apply_lever, parse_campaign

CAMPAIGN = """
[campaign]
name = "spec"
[model]
preset = "small"
[hardware]
gpu = "h200"
[deployment]
engine = "embedded"
[bench]
concurrency = [1, 8, 64]
[[lever]]
name = "mtp"
speculative = { method = "mtp", num_speculative_tokens = 3 }
"""


def stored(tmp_path, levers: list[str]) -> Store:
    spec = parse_campaign(CAMPAIGN)
    store = Store.create(tmp_path / "run")
    ctx = StageContext(spec=spec, store=store, say=print, stage=print)
    variant = levers[-1] if levers else "baseline"
    dep = apply_lever(spec.deployment, [lv for lv in spec.levers if lv.name in levers])
    run_roofline(ctx, Block(variant, levers, "main", 0), dep, 64)
    return store


def test_a_speculative_variant_stores_its_verify_and_draft_floors(tmp_path):
    store = stored(tmp_path, ["mtp"])
    floors = store.analysis("mtp", "speculative_roofline")
    assert (floors["method"], floors["k"], floors["draft"], floors["draft_modelled"]) == ("mtp", 3, "mtp", True)
    steps = {s["batch"]: s for s in floors["steps"]}
    assert {1, 8, 64, 1024} <= set(steps) and max(steps) == 1024  # the sweep's levels and powers of two
    plain = store.analysis("mtp", "roofline")
    assert steps[64]["plain_ms"] == pytest.approx(plain["floor_ms"])  # the same plain floor, at the profile's batch
    for s in steps.values():  # a verify of k + 1 tokens a sequence costs at least a decode step; MTP drafts cost
        assert s["verify_ms"] >= s["plain_ms"] > 0 and s["draft_ms"] > 0
    # k + 1 queries a sequence on the same weights: the verify step turns compute-bound at a smaller batch
    verify, plain_bound = floors["verify_compute_bound_batch"], floors["plain_compute_bound_batch"]
    assert verify is not None and (plain_bound is None or verify < plain_bound)
    assert stored(tmp_path / "b", []).analysis("baseline", "speculative_roofline") is None
