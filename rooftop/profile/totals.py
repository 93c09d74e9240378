"""In-step time added up by what a summary reports: item name and kind, code path, CPU op name and shapes.

Streamed attribution hands over items a block at a time; a summary needs only their sums, whose
number is set by the model's code (names, modules, shapes), not by how many steps were profiled.
"""

from dataclasses import dataclass

import numpy as np

from rooftop.profile.attribute import Attribution

_KEYS = ("name", "kind", "path", "op_name", "op_dims")


@dataclass(slots=True)
class Totals:
    """In-step items added up per (name, kind, path, op name, op dims): time and item count."""

    name: np.ndarray  # index into trace.names
    kind: np.ndarray
    path: np.ndarray  # index into paths
    op_name: np.ndarray  # index into trace.names, -1 without a CPU op
    op_dims: np.ndarray  # index into trace.shapes, -1 without
    dur_ns: np.ndarray
    calls: np.ndarray
    paths: list[tuple[str, ...]]


class TotalsBuilder:
    """Adds up chunks of attributed items (each with its own path list) into one `Totals`."""

    def __init__(self):
        self.paths: list[tuple[str, ...]] = []
        self._path_ids: dict[tuple[str, ...], int] = {}
        self._sums: dict[tuple[int, ...], list[int]] = {}

    def path_id(self, path: tuple[str, ...]) -> int:
        pid = self._path_ids.get(path)
        if pid is None:
            pid = self._path_ids[path] = len(self.paths)
            self.paths.append(path)
        return pid

    def add(self, att: Attribution) -> None:
        """Add the in-step items of `att`."""
        inside = att.step >= 0
        if not inside.any():
            return
        n = int(inside.sum())
        none = np.full(n, -1, dtype=np.int64)
        cols = [att.name[inside], att.kind[inside], att.path[inside],
                none if att.op_name is None else att.op_name[inside], none if att.op_dims is None else att.op_dims[inside]]
        dur = att.dur_ns[inside]
        calls = np.ones(n, dtype=np.int64) if att.calls is None else att.calls[inside]
        order = np.lexsort(cols[::-1])
        cols = [c[order] for c in cols]
        dur, calls = dur[order], calls[order]
        new = np.ones(n, dtype=bool)
        new[1:] = np.any([c[1:] != c[:-1] for c in cols], axis=0)
        starts = np.flatnonzero(new)
        sums = np.add.reduceat(dur, starts)
        counts = np.add.reduceat(calls, starts)  # a kernel split over paths counts once
        global_path = {p: self.path_id(att.paths[p]) for p in np.unique(cols[2]).tolist()}
        for key, d, c in zip(zip(*(col[starts].tolist() for col in cols), strict=True), sums.tolist(), counts.tolist(),
                             strict=True):
            key = (key[0], key[1], global_path[key[2]], key[3], key[4])
            acc = self._sums.get(key)
            if acc is None:
                self._sums[key] = [d, c]
            else:
                acc[0] += d
                acc[1] += c

    def build(self) -> Totals:
        keys = list(self._sums)
        cols = np.array(keys, dtype=np.int64).reshape(len(keys), len(_KEYS)).T
        vals = np.array(list(self._sums.values()), dtype=np.int64).reshape(len(keys), 2).T
        return Totals(*cols, dur_ns=vals[0], calls=vals[1], paths=self.paths)
