"""A profile as the campaign stores it in the traces table (a real SQLite store, a real trace) and reads it
back: the typed summary and the campaign's role, measured line and ranks, also from a store an older
campaign wrote."""

from pathlib import Path

from rooftop.campaign.collect import profile_evidence
from rooftop.campaign.store import Store
from rooftop.campaign.stored_profile import StoredProfile
from rooftop.profile import analyze, load_trace
from rooftop.profile.capacity import CapacityFinding

TRACE = Path(__file__).parents[1] / "profile" / "data" / "gpu_sm90_small.json"


def _stored() -> StoredProfile:
    summary = analyze(load_trace(TRACE), context_length=262144)
    summary.notes.append("Rank 1 (b.json) lags the others: ...")
    return StoredProfile(summary, "decode", "the steps as served (CUDA graphs), without an eager map",
                         ranks=[{"rank": 0, "label": "a.json", "busy_ms": 1.0}, {"rank": 1, "label": "b.json",
                                                                              "busy_ms": 1.2}])


def test_a_stored_profile_reads_back_as_it_was_written(tmp_path):
    stored = _stored()
    store = Store.create(tmp_path)
    store.put_trace("pd/decode", "traces/pd/decode/t.json", stored.to_json_dict(), 4)
    row = Store.open(tmp_path).traces()[0]
    back = StoredProfile.from_json_dict(row.analysis)
    assert back == stored and row.analysis["role"] == "decode"

    ev = profile_evidence(row.variant, row.path, row.concurrency, back)
    assert ev.device == "gpu" and ev.steps == stored.summary.steps and ev.concurrency == 4
    assert ev.busy_ms_per_step == stored.summary.gpu_busy_ms_per_step
    assert ev.measured == "the steps as served (CUDA graphs), without an eager map"
    assert isinstance(ev.capacity_findings[0], CapacityFinding) and ev.capacity_findings[0].component == "indexer"
    assert [c.share for c in ev.components] == sorted((c.share for c in ev.components), reverse=True)
    assert ev.notes[-1].startswith("Rank 1 (b.json) lags")


def test_a_profile_an_older_campaign_stored_still_reads(tmp_path):
    """Before pd was profiled a trace had no role, before eager maps no measured line, and the first stores
    lacked the summary's later keys (trace, unit shares, paths, attribution source, unattributed share, GPUs)."""
    new = _stored()
    old = new.to_json_dict()
    for key in ("role", "measured", "ranks", "trace", "unit_shares", "attribution_source", "unattributed_share",
                "devices"):
        del old[key]
    for c in old["components"]:
        del c["paths"]
    for f in old["capacity_findings"]:
        del f["path"], f["share"]
    store = Store.create(tmp_path)
    store.put_trace("baseline", "traces/baseline/t.json", old, 4)
    back = StoredProfile.from_json_dict(Store.open(tmp_path).traces()[0].analysis)
    assert back.role == "single" and back.measured == "" and back.ranks is None
    ev = profile_evidence("baseline", "traces/baseline/t.json", 4, back)
    assert ev.attribution_source == new.summary.granularity  # what the documents showed for these stores
    assert ev.capacity_findings[0].dim == new.summary.capacity_findings[0].dim
    assert ev.capacity_findings[0].ms_per_step == new.summary.capacity_findings[0].ms_per_step
    assert ev.idle_share == new.summary.gpu_idle_share and ev.notes == new.summary.notes
