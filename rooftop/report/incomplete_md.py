"""The banner at the top of an incomplete run's documents: which bring-ups did not run or failed, why
where the store says, and how to resume."""

from __future__ import annotations

from pathlib import Path

from rooftop.campaign.completeness import FAILED, INTERRUPTED, NOT_RUN, BlockState, Completeness


def _cut(b: BlockState) -> str:
    if b.running:
        return f"{b.name} (in its {b.stage} when the campaign stopped, unless it is still running)"
    return f"{b.name} (interrupted in its {b.stage})"


def _not_run(b: BlockState) -> str:
    """'main/pd/r2', or 'main/pd/r2 (profile, teardown left)' for a block that got part of the way."""
    return b.name + (f" ({', '.join(b.not_done)} left)" if b.started else "")


def lines(c: Completeness) -> list[str]:
    """One line per kind of gap: failed (stage and error), interrupted (stage), not run (keys)."""
    out = []
    failed, cut, missing = c.with_state(FAILED), c.with_state(INTERRUPTED), c.with_state(NOT_RUN)
    if failed:
        out.append("Failed: " + "; ".join(f"{b.name} at {b.stage}: {b.error or 'no error recorded'}" for b in failed))
    if cut:
        out.append("Interrupted: " + "; ".join(_cut(b) for b in cut))
    if missing:
        out.append("Not run: " + ", ".join(_not_run(b) for b in missing))
    return out


def banner(c: Completeness, run_dir: Path | str) -> str:
    """A markdown block quote saying the run is incomplete; '' for a complete run."""
    if c.complete:
        return ""
    head = (f"> **Incomplete run: {c.done} of {len(c.blocks)} planned bring-ups ran to their end.** The figures "
            "below come from what ran: a variant short of repeats has wider intervals, or none (one repeat), "
            "and the finding may change once the rest is measured.")
    body = [f"> - {line}" for line in lines(c)]
    resume = (f"> Resume with `rooftop run --resume {run_dir}`: it runs what is missing (a failed bring-up is "
              "tried again) and rewrites these documents.")
    return "\n".join([head, ">", *body, ">", resume]) + "\n"
