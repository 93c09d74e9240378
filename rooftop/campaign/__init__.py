"""Campaigns: the store, the plan and runner, lever verdicts, quality checks and the diagnosis."""
