"""Rebuild every document of a run directory from its store alone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rooftop.campaign import completeness as completeness_mod
from rooftop.campaign import plan as plan_mod
from rooftop.campaign.collect import JOINED, collect
from rooftop.campaign.diagnosis import diagnose
from rooftop.campaign.store import Store
from rooftop.report import html, plan_md, plots, results_json, summary_md
from rooftop.spec.campaign import parse_campaign


@dataclass(slots=True)
class ReportPaths:
    """What build_report wrote."""

    summary: Path
    plan: Path
    results: Path
    plots: dict[str, Path]
    html: Path


def build_report(run_dir: Path | str) -> ReportPaths:
    """SUMMARY.md, PLAN.md, plots/*.png, results.json and report.html under run_dir, from run_dir/store.sqlite."""
    run_dir = Path(run_dir)
    store = Store.open(run_dir)
    try:
        run = store.run()
        spec = parse_campaign(run.spec_toml, run.spec_path or run_dir / "store.sqlite")
        ev = collect(store, spec)
        dx = diagnose(ev)
        units = store.units()
        joined = {d.subject for d in store.decisions(JOINED)}
        remaining = plan_mod.remaining_keys(plan_mod.campaign_plan(spec, joined), units)
        done = completeness_mod.read(store, spec, joined)
        timelines = sorted(run_dir.glob("**/bench/timeline.json.gz"))  # the sweeps' own, beside requests.jsonl
        made = plots.write_all(ev, run_dir / "plots", timelines[0] if timelines else None)
        deployments = store.deployments()
        out = ReportPaths(run_dir / "SUMMARY.md", run_dir / "PLAN.md", run_dir / "results.json", made,
                          run_dir / "report.html")
        summary = summary_md.render(run, ev, dx, deployments, made, run_dir, done)
        out.summary.write_text(summary)
        out.plan.write_text(plan_md.render(run, spec, ev, dx, units, store.unit_errors(), remaining,
                                           store.decisions(), made, run_dir, done))
        out.results.write_text(results_json.render(ev, dx, units, remaining, done, deployments))
        images = {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in made.values()}
        out.html.write_text(html.render(summary, images), encoding="utf-8")
        return out
    finally:
        store.close()
