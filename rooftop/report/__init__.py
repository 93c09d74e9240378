"""Documents of a run: SUMMARY.md, PLAN.md, plots and results.json, rebuilt from the store."""
