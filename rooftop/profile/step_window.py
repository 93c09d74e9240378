"""Map a streamed trace through an eager map one group of whole steps at a time.

The eager map (profile/mapping.py) aligns a step's whole sequence of items with a step of the map,
so items wait here until their step is complete (the stream says up to when steps are), then the
complete steps go through `apply_map` together and into the totals. Memory is the items of the steps
not yet complete: a step, plus those of the last HORIZON_NS while a GPU may still run their kernels.
"""

import numpy as np

from rooftop.profile.attribute import ITEM_FIELDS, Attribution
from rooftop.profile.mapping import ENCLOSED, FILLED, MATCHED, MapStats, apply_map
from rooftop.profile.totals import TotalsBuilder
from rooftop.profile.trace import Trace

FLUSH_ITEMS = 1 << 16  # complete steps are mapped once this many items wait (or at the end)


class StepWindow:
    """Collects streamed items by step; maps complete steps through the eager map into `totals`."""

    def __init__(self, trace: Trace, map_att: Attribution, map_trace: Trace, source: str, totals: TotalsBuilder):
        self.trace, self.map_att, self.map_trace, self.source, self.totals = trace, map_att, map_trace, source, totals
        self.waiting: list[Attribution] = []
        self.n_waiting = 0
        self.how_ns = {MATCHED: 0.0, FILLED: 0.0, ENCLOSED: 0.0}
        self.ends_ns: np.ndarray | None = None
        self.replays = self.skipped = 0

    def add(self, chunk: Attribution, _rows: np.ndarray, done_ns: int) -> None:
        inside = chunk.step >= 0
        if inside.any():
            self.waiting.append(_take(chunk, inside))
            self.n_waiting += int(inside.sum())
        if self.n_waiting >= FLUSH_ITEMS:
            self.flush(done_ns)

    def flush(self, done_ns: int) -> None:
        """Map every waiting item whose step ended before `done_ns`."""
        if not self.waiting:
            return
        steps = self.waiting[0].steps
        if self.ends_ns is None:
            self.ends_ns = np.array([s.end_ns for s in steps] or [np.iinfo(np.int64).max], dtype=np.int64)
        group = _concat(self.waiting)
        complete = self.ends_ns[group.step] <= done_ns
        self.waiting = [_take(group, ~complete)] if not complete.all() else []
        self.n_waiting = len(self.waiting[0].step) if self.waiting else 0
        if complete.any():
            self._map(_take(group, complete))

    def _map(self, att: Attribution) -> None:
        mapped, stats = apply_map(att, self.trace, self.map_att, self.map_trace, self.source)
        total_ns = float(att.dur_ns.sum())
        self.how_ns[MATCHED] += stats.matched_share * total_ns
        self.how_ns[FILLED] += stats.filled_share * total_ns
        self.how_ns[ENCLOSED] += stats.enclosed_share * total_ns
        self.replays += stats.replays
        self.skipped = stats.skipped_steps
        self.totals.add(mapped)

    def stats(self) -> MapStats:
        total = sum(self.how_ns.values()) or 1.0
        map_steps = len({int(s) for s in self.map_att.step.tolist() if s >= 0})
        return MapStats(self.source, self.how_ns[MATCHED] / total, self.how_ns[FILLED] / total,
                        self.how_ns[ENCLOSED] / total, map_steps, self.replays, self.skipped)


def _take(att: Attribution, sel: np.ndarray) -> Attribution:
    fields = {f: getattr(att, f)[sel] for f in ITEM_FIELDS}
    return Attribution(basis=att.basis, granularity=att.granularity, paths=att.paths, path_component=[],
                       steps=att.steps, busy_ns=att.busy_ns, wall_ns=att.wall_ns, **fields)


def _concat(chunks: list[Attribution]) -> Attribution:
    """Chunks of one stream, whose path lists only grow: the last one's holds every path."""
    last = chunks[-1]
    fields = {f: np.concatenate([getattr(c, f) for c in chunks]) for f in ITEM_FIELDS}
    return Attribution(basis=last.basis, granularity=last.granularity, paths=last.paths, path_component=[],
                       steps=last.steps, busy_ns=last.busy_ns, wall_ns=last.wall_ns, **fields)
