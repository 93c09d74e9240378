"""Attribute a trace whose module boundaries are gone through a map: a trace of the same step run eagerly.

A compiled step (torch.compile, vLLM's default) runs the model's ops inside one compiled region: the
`nn.Module` frames that tell a norm from an MLP are not in the trace, and fused generated kernels
(`cpp_fused_*`, `triton_*`) stand where several eager ops stood. The same engine run eagerly (vLLM
`--enforce-eager`) records every op under its module. Each step's sequence of work items (CPU ops,
or kernels) is aligned with a step of the eager trace by name:

- an item that matches one-to-one takes its eager counterpart's module path;
- items that replace a run of eager items (a fused kernel where eager ran several ops) share their
  time among those eager items' paths in proportion to the eager items' time;
- items with no eager counterpart between two matched neighbours take the innermost module that
  encloses both neighbours.

Pure: attributions in, an attribution out.
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher

import numpy as np

from rooftop.errors import RooftopError
from rooftop.profile.attribute import Attribution, component_name
from rooftop.profile.trace import Trace

MATCHED, FILLED, ENCLOSED = "matched", "filled", "enclosed"


@dataclass(slots=True)
class MapStats:
    """How the target's step time was attributed through the map: shares of in-step time."""

    source: str
    matched_share: float  # items matched one-to-one with an eager item
    filled_share: float  # items that replace eager items (fused or split work): time shared among them
    enclosed_share: float  # items with no eager counterpart: the module enclosing their neighbours
    map_steps: int

    def note(self) -> str:
        return (f"module paths come from the eager map {self.source}: {self.matched_share:.0%} of the step's time "
                f"matched op for op, {self.filled_share:.0%} shared among the eager ops it replaced (fused or "
                f"split work), {self.enclosed_share:.0%} given the module enclosing its neighbours")


def _sequences(att: Attribution, trace: Trace, ts_ns: np.ndarray) -> dict[int, list[int]]:
    """Per step: indices of its items in time order."""
    out: dict[int, list[int]] = {}
    order = np.lexsort((-att.dur_ns, ts_ns))
    for i in order.tolist():
        s = int(att.step[i])
        if s >= 0:
            out.setdefault(s, []).append(i)
    return out


def _item_ts(att: Attribution, trace: Trace) -> np.ndarray:
    if att.ts_ns is not None:
        return att.ts_ns
    return trace.kernels.ts_ns if att.basis == "kernels" else trace.ops.ts_ns


def _pick_map_step(map_att: Attribution, map_seqs: dict[int, list[int]], label: str) -> int:
    """The map step to align with a target step labelled `label`: among the map's steps with that label
    (else all), the one of median busy time."""
    same = [s for s in map_seqs if map_att.steps and map_att.steps[s].label == label]
    pool = same or list(map_seqs)
    pool.sort(key=lambda s: int(map_att.busy_ns[s]) if s < len(map_att.busy_ns) else 0)
    return pool[len(pool) // 2]


def _common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def apply_map(target: Attribution, target_trace: Trace, map_att: Attribution, map_trace: Trace,
              source: str) -> tuple[Attribution, MapStats]:
    """`target` with every in-step item given a module path from `map_att` (see the module doc)."""
    if map_att.granularity != "module":
        raise RooftopError(f"the eager map {source} has no module stacks",
                           "capture it with with_stack=True and with_modules=True (vLLM: --enforce-eager)")
    if map_att.basis != target.basis:
        raise RooftopError(f"the eager map {source} has {map_att.basis.replace('_', ' ')} where the trace has "
                           f"{target.basis.replace('_', ' ')}", "capture both on the same device")
    map_seqs = _sequences(map_att, map_trace, _item_ts(map_att, map_trace))
    if not map_seqs:
        raise RooftopError(f"the eager map {source} has no steps with work in them", "capture it while serving")
    map_names = [map_trace.names[n] for n in map_att.name.tolist()]
    tgt_names = [target_trace.names[n] for n in target.name.tolist()]

    paths = list(target.paths)
    path_ids: dict[tuple[str, ...], int] = {p: i for i, p in enumerate(paths)}

    def path_id(p: tuple[str, ...]) -> int:
        pid = path_ids.get(p)
        if pid is None:
            pid = path_ids[p] = len(paths)
            paths.append(p)
        return pid

    # rows of the result: (target item, path id, duration); a filled item may become several rows
    rows_item: list[int] = []
    rows_path: list[int] = []
    rows_dur: list[int] = []
    how_ns = {MATCHED: 0, FILLED: 0, ENCLOSED: 0}
    aligned: dict[tuple, list[tuple[int, tuple[str, ...], float, str]]] = {}

    tgt_seqs = _sequences(target, target_trace, _item_ts(target, target_trace))
    for step, items in tgt_seqs.items():
        names = [tgt_names[i] for i in items]
        label = target.steps[step].label if target.steps else ""
        key = (label, tuple(names))
        plan = aligned.get(key)
        if plan is None:
            plan = aligned[key] = _align(names, map_seqs[_pick_map_step(map_att, map_seqs, label)], map_names, map_att)
        for i, parts in zip(items, plan, strict=True):
            d = int(target.dur_ns[i])
            for path, frac, how in parts:
                rows_item.append(i)
                rows_path.append(path_id(path))
                rows_dur.append(int(round(d * frac)))
                how_ns[how] += int(round(d * frac))
    outside = np.flatnonzero(target.step < 0)
    items = np.concatenate([np.array(rows_item, dtype=np.int64), outside])
    dur = np.concatenate([np.array(rows_dur, dtype=np.int64), target.dur_ns[outside]])
    path = np.concatenate([np.array(rows_path, dtype=np.int64), target.path[outside]])
    total = sum(how_ns.values()) or 1
    stats = MapStats(source, how_ns[MATCHED] / total, how_ns[FILLED] / total, how_ns[ENCLOSED] / total,
                     len(map_seqs))
    out = Attribution(
        basis=target.basis, granularity="module", name=target.name[items], kind=target.kind[items], dur_ns=dur,
        step=target.step[items], path=path, op=target.op[items], graph=target.graph[items], paths=paths,
        path_component=[component_name(p, "module") for p in paths], steps=target.steps, busy_ns=target.busy_ns, wall_ns=target.wall_ns,
        notes=[n for n in target.notes if "no module stacks" not in n] + [stats.note()],
        source=f"eager map {source}",
        ts_ns=None if target.ts_ns is None else target.ts_ns[items],
        op_name=None if target.op_name is None else target.op_name[items],
        op_dims=None if target.op_dims is None else target.op_dims[items],
    )
    return out, stats


def _align(names: list[str], map_items: list[int], map_names: list[str],
           map_att: Attribution) -> list[list[tuple[tuple[str, ...], float, str]]]:
    """For each target item of one step: [(module path, share of its time, how)]."""
    ref = [map_names[j] for j in map_items]
    ref_path = [map_att.paths[int(map_att.path[j])] for j in map_items]
    ref_dur = [max(int(map_att.dur_ns[j]), 1) for j in map_items]
    plan: list[list[tuple[tuple[str, ...], float, str]]] = [[] for _ in names]
    ops = SequenceMatcher(None, names, ref, autojunk=False).get_opcodes()
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            for k in range(i2 - i1):
                plan[i1 + k] = [(ref_path[j1 + k], 1.0, MATCHED)]
        elif tag in ("replace", "delete"):  # difflib turns `names` into `ref`: "delete" = target items only
            if j2 > j1:
                weight: dict[tuple[str, ...], int] = {}
                for j in range(j1, j2):
                    weight[ref_path[j]] = weight.get(ref_path[j], 0) + ref_dur[j]
                total = sum(weight.values())
                parts = [(p, w / total, FILLED) for p, w in weight.items()]
            else:
                before = ref_path[j1 - 1] if j1 > 0 else ()
                after = ref_path[j1] if j1 < len(ref_path) else ()
                parts = [(_common_prefix(before, after) if before and after else before or after, 1.0, ENCLOSED)]
            for i in range(i1, i2):
                plan[i] = parts
    return plan
