"""`rooftop report RUN_DIR`: rebuild SUMMARY.md, PLAN.md, plots, results.json and report.html from the store."""

from pathlib import Path

import typer


def command(run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="a run directory with store.sqlite")) -> None:
    """Rebuild a run's documents from its store."""
    from rooftop.report.build import build_report

    paths = build_report(run_dir)
    for p in (paths.summary, paths.plan, paths.results, paths.html, *paths.plots.values()):
        print(p)
