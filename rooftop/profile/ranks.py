"""Profiles of every rank of one server, side by side: per-rank step time and components, and stragglers.

A server spread over GPUs (tensor or expert parallel, one host or several) writes one trace per rank. In a
synchronous step every rank ends together, so a slow rank shows in the others as time spent waiting in
collectives, not as a longer step: each rank's own work is its busy time less its communication time.
A rank whose own work exceeds the median rank's by more than `threshold` lags the others (a straggler:
a slower GPU or link, a hotter expert); a component whose time differs that much across ranks names
where (imbalanced experts show in `moe`).

Pure functions: per-rank summaries in, a table and sentences out.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from rooftop.profile.summary import ProfileSummary

STRAGGLER_THRESHOLD = 0.10  # a rank's own work this much over the median rank's is a finding
MIN_COMPONENT_SHARE = 0.05  # components smaller than this share of the step are not compared


@dataclass(slots=True)
class RankStat:
    """One rank's step: busy, communication and own work in ms per step, and its components' ms per step."""

    rank: int
    label: str  # where it ran: the trace file, with the host where known
    busy_ms: float
    comm_ms: float
    idle_share: float
    components_ms: dict[str, float]

    @property
    def own_ms(self) -> float:
        """Busy time that is not communication: the rank's own work."""
        return self.busy_ms - self.comm_ms


def rank_stat(rank: int, label: str, summary: ProfileSummary) -> RankStat:
    """A RankStat from one rank's analysed trace."""
    busy = summary.gpu_busy_ms_per_step
    components: dict[str, float] = {}
    for c in summary.components:
        components[c.name] = components.get(c.name, 0.0) + c.ms_per_step
    return RankStat(rank, label, busy, busy * summary.categories.get("communication", 0.0), summary.gpu_idle_share,
                    components)


def rank_table(stats: list[RankStat]) -> list[dict]:
    """One row per rank: busy, communication and own ms per step, own work against the median rank's
    (`own_vs_median`, 0.12 = 12% over), and each component's ms per step."""
    mid = median(s.own_ms for s in stats) if stats else 0.0
    return [
        {"rank": s.rank, "label": s.label, "busy_ms": s.busy_ms, "comm_ms": s.comm_ms, "own_ms": s.own_ms,
         "own_vs_median": (s.own_ms / mid - 1.0) if mid > 0 else 0.0, "idle_share": s.idle_share,
         "components_ms": dict(s.components_ms)}
        for s in sorted(stats, key=lambda s: s.rank)
    ]


def component_spread(stats: list[RankStat]) -> dict[str, tuple[float, float, int]]:
    """{component: (median ms, max ms, rank with the max)} over ranks, for components that are at least
    MIN_COMPONENT_SHARE of the median rank's busy time."""
    if not stats:
        return {}
    busy = median(s.busy_ms for s in stats)
    names = {n for s in stats for n in s.components_ms}
    out = {}
    for name in sorted(names):
        values = [(s.components_ms.get(name, 0.0), s.rank) for s in stats]
        mid = median(v for v, _ in values)
        if busy > 0 and mid / busy >= MIN_COMPONENT_SHARE:
            top, rank = max(values)
            out[name] = (mid, top, rank)
    return out


def stragglers(stats: list[RankStat], threshold: float = STRAGGLER_THRESHOLD) -> list[str]:
    """Sentences for the ranks whose own work lags the median rank's by more than `threshold`, each with
    the component that differs most there; and for components whose time differs that much across ranks."""
    if len(stats) < 2:
        return []
    mid = median(s.own_ms for s in stats)
    if mid <= 0:
        return []
    spread = component_spread(stats)
    out = []
    for s in sorted(stats, key=lambda s: -s.own_ms):
        over = s.own_ms / mid - 1.0
        if over <= threshold:
            break
        others = [o for o in stats if o is not s]
        waits = median(o.comm_ms for o in others)
        worst = max(spread, key=lambda n: s.components_ms.get(n, 0.0) - spread[n][0], default=None)
        where = ""
        if worst is not None and s.components_ms.get(worst, 0.0) > spread[worst][0]:
            where = (f"; its {worst} takes {s.components_ms[worst]:.3f} ms against {spread[worst][0]:.3f} ms on the "
                     "median rank")
        out.append(
            f"Rank {s.rank} ({s.label}) lags the others: its own work (busy less communication) is "
            f"{s.own_ms:.3f} ms per step, {over:.0%} over the median rank's {mid:.3f} ms{where}. The other ranks "
            f"wait for it in communication ({waits:.3f} ms per step on the median rank against {s.comm_ms:.3f} ms "
            "on it): every synchronous step runs at its pace. Check that rank's GPU (clocks, thermals, "
            "placement) and its link, and the expert balance where the gap is in MoE."
        )
    for name, (mid_ms, top_ms, rank) in spread.items():
        if mid_ms > 0 and top_ms / mid_ms - 1.0 > max(threshold, 0.25) and not any(f"its {name} " in o for o in out):
            out.append(
                f"{name} time differs across ranks: {top_ms:.3f} ms per step on rank {rank} against a median of "
                f"{mid_ms:.3f} ms" + (" (experts imbalanced: tokens routed unevenly across the ranks' experts)"
                                      if name == "moe" else "") + "."
            )
    return out


def is_rank_note(note: str) -> bool:
    """Whether a profile note is one of `stragglers`' sentences (the campaign's diagnosis lifts them)."""
    return (note.startswith("Rank ") and " lags the others: " in note) or " time differs across ranks: " in note


_RANKS = (re.compile(r"rank(\d+)"), re.compile(r"(?:^|[._-])(?:TP-|tp)(\d+)(?:[._-]|$)"))


def trace_rank(path: Path) -> int | None:
    """The rank a trace file's name gives (`..._rank3.*` from vLLM, `...-TP-3.*` from SGLang); None if none."""
    for pattern in _RANKS:
        m = pattern.search(path.name)
        if m:
            return int(m.group(1))
    return None


def trace_labels(traces: list[Path]) -> list[tuple[int, str]]:
    """(rank, label) of each of a server's traces, in order: the rank its file name gives where every name
    gives a different one (else its position), the label the file name and, where the traces lie in
    several directories (capture keeps each host's in its own, named after the host), "on DIR"."""
    ranks = [trace_rank(p) for p in traces]
    if None in ranks or len(set(ranks)) != len(ranks):
        ranks = list(range(len(traces)))
    spread = len({p.parent for p in traces}) > 1
    return [(r, f"{p.name} on {p.parent.name}" if spread else p.name) for r, p in zip(ranks, traces, strict=True)]


def rank_report(traces: list[Path], first: ProfileSummary,
                analyze_one: Callable[[Path], ProfileSummary]) -> tuple[list[dict], list[str]]:
    """(rank_table, stragglers) of a server's traces, rank 0 first: `first` is the first trace's summary,
    the others are analysed with `analyze_one`; ranks and labels from `trace_labels`. A rank whose trace
    cannot be analysed is left out and named."""
    (rank0, label0), *others = trace_labels(traces)
    stats = [rank_stat(rank0, label0, first)]
    notes = []
    for (rank, label), path in zip(others, traces[1:], strict=True):
        try:
            stats.append(rank_stat(rank, label, analyze_one(path)))
        except Exception as exc:  # noqa: BLE001 - one unreadable rank leaves the others' comparison
            notes.append(f"rank {rank}'s trace ({label}) could not be analysed: {exc}")
    return rank_table(stats), stragglers(stats) + notes
