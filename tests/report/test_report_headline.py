"""What SUMMARY.md puts first: the answer to the goal where no lever gained."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "campaign"))

from sample_store import populate  # noqa: E402

from rooftop.report.build import build_report  # noqa: E402


def test_the_headline_of_a_run_where_no_lever_gained_says_what_bounds_the_step(tmp_path):
    """The vLLM example's shape: every lever within noise of the baseline, no capacity-sized work. The
    headline was the lever that lost ('PD did not help'); it answers the goal instead, PD beside it."""
    st = populate(tmp_path)
    base = {(r.repeat, r.concurrency): r.summary for r in st.levels("baseline")}
    for variant in ("context-cap", "indexer-actual"):  # the two levers that gained: now the baseline's figures
        for row in st.levels(variant):
            st.put_level(row.series, variant, row.repeat, row.concurrency, base[(row.repeat, row.concurrency)], True)
    trace = next(t for t in st.traces("baseline"))
    st.put_trace("baseline", trace.path, {**trace.analysis, "capacity_findings": []}, trace.concurrency)
    st.close()
    out = build_report(tmp_path)
    summary, plan = out.summary.read_text(), out.plan.read_text()
    head = summary.split("## Stack")[0]
    finding = next(line for line in head.splitlines() if line.startswith("> **Finding:**"))
    assert finding.startswith("> **Finding:** The indexer takes 70% of each decode step (")
    assert "its roofline floor of 2.000 ms" in finding and "× [" in finding
    assert "No lever raised tok/s beyond noise at any level: pd " in finding and "context-cap " in finding
    assert "> **PD:** PD (lever pd: prefill and decode on separate workers) did not help" in head
    assert "| 1 | The indexer bounds the decode step | context |" in summary
    assert "- Top bottleneck: **The indexer bounds the decode step**" in plan
    assert "\n1. Shorten the indexer (70% of the decode step): put a change that does" in plan
    doc = json.loads(out.results.read_text())
    assert doc["findings"][0]["rule"] == "what_bounds" and doc["findings"][0]["numbers"]["share"] == 0.70

