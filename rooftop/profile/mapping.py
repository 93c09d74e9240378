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

from collections import Counter
from dataclasses import dataclass
from difflib import SequenceMatcher

import numpy as np

from rooftop.errors import RooftopError
from rooftop.profile.attribute import Attribution, component_name
from rooftop.profile.steps import label_phase
from rooftop.profile.trace import Trace

MATCHED, FILLED, ENCLOSED = "matched", "filled", "enclosed"
# names of the record_function ranges (or ops) of a torch.compile region, inside which modules are not seen
COMPILED_MARKERS = ("## Call CompiledFxGraph", "Torch-Compiled Region", "CompiledFunction")


@dataclass(slots=True)
class MapStats:
    """How the target's step time was attributed through the map: shares of in-step time."""

    source: str
    matched_share: float  # items matched one-to-one with an eager item
    filled_share: float  # items that replace eager items (fused or split work): time shared among them
    enclosed_share: float  # items with no eager counterpart: the module enclosing their neighbours
    map_steps: int
    replays: int = 0  # in a trace without steps: the CUDA-graph replays aligned one by one
    skipped_steps: int = 0  # map steps left out: they ran CUDA graphs or torch.compile themselves

    def note(self) -> str:
        out = (f"module paths come from the eager map {self.source}: {self.matched_share:.0%} of the step's time "
               f"matched op for op, {self.filled_share:.0%} shared among the eager ops it replaced (fused or "
               f"split work), {self.enclosed_share:.0%} given the module enclosing its neighbours")
        if self.skipped_steps:
            out += (f"; {self.skipped_steps} of the map's steps ran CUDA graphs or torch.compile, which hide modules, "
                    f"and were left out of it")
        if self.replays:
            out += (f"; the trace has no steps, so each of its {self.replays} CUDA-graph replays was aligned with the "
                    "map on its own")
        return out


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


class _MapSteps:
    """The map's steps, each with what it ran (its items' names, counted), its label's phase and busy time."""

    def __init__(self, map_att: Attribution, map_seqs: dict[int, list[int]], map_names: list[str]):
        self.seqs = map_seqs
        self.counts = {s: Counter(map_names[j] for j in items) for s, items in map_seqs.items()}
        self.phase = {s: label_phase(map_att.steps[s].label) if s < len(map_att.steps) else "" for s in map_seqs}
        self.phase_steps = Counter(self.phase.values())
        self.busy = {s: int(map_att.busy_ns[s]) if s < len(map_att.busy_ns) else 0 for s in map_seqs}

    def pick(self, names: list[str], label: str) -> int:
        """The map step to align a target step (`names`, labelled `label`) with: the one that ran the most
        of the same kernels or ops (a decode step's map is a decode step, not a prefill); ties go to the
        one of median busy time. A label narrows the choice only where it names a phase, i.e. several map
        steps share it once numbers are stripped (`prefill`/`decode`; not `ProfilerStep#N`, which is every
        step's)."""
        phase = label_phase(label)
        pool = [s for s in self.seqs if self.phase[s] == phase] if self.phase_steps[phase] >= 2 else []
        pool = pool or list(self.seqs)
        want = Counter(names)
        score = {s: 2 * sum((want & self.counts[s]).values()) / max(len(names) + len(self.seqs[s]), 1) for s in pool}
        best = max(score.values())
        tied = sorted((s for s in pool if score[s] >= best - 1e-12), key=lambda s: (self.busy[s], s))
        return tied[len(tied) // 2]


def _common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def apply_map(target: Attribution, target_trace: Trace, map_att: Attribution, map_trace: Trace,
              source: str) -> tuple[Attribution, MapStats]:
    """`target` with every in-step item given a module path from `map_att` (see the module doc)."""
    no_modules = RooftopError(f"the eager map {source} has no module stacks",
                              "capture it with with_stack=True and with_modules=True (vLLM: --enforce-eager)")
    if map_att.granularity != "module" and not map_att.graph.any():
        raise no_modules  # (a graph trace's map says it ran graphs, below)
    if map_att.basis != target.basis:
        raise RooftopError(f"the eager map {source} has {map_att.basis.replace('_', ' ')} where the trace has "
                           f"{target.basis.replace('_', ' ')}", "capture both on the same device")
    map_seqs = _sequences(map_att, map_trace, _item_ts(map_att, map_trace))
    if not map_seqs:
        raise RooftopError(f"the eager map {source} has no steps with work in them", "capture it while serving")
    map_seqs, skipped = _eager_steps(map_att, map_seqs, source)
    if map_att.granularity != "module":
        raise no_modules
    map_names = [map_trace.names[n] for n in map_att.name.tolist()]
    map_steps = _MapSteps(map_att, map_seqs, map_names)
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
    rows_from: list[int] = []  # the map item whose CPU op the row takes where it has none (-1: none)
    rows_call: list[int] = []
    how_ns = {MATCHED: 0, FILLED: 0, ENCLOSED: 0}
    aligned: dict[tuple, list[tuple[int, tuple[str, ...], float, str]]] = {}

    units, replays = _units(target, _sequences(target, target_trace, _item_ts(target, target_trace)),
                            target_trace, source)
    for label, items in units:
        names = [tgt_names[i] for i in items]
        key = (label, tuple(names))
        plan = aligned.get(key)
        if plan is None:
            plan = aligned[key] = _align(names, map_seqs[map_steps.pick(names, label)], map_names, map_att)
        for i, parts in zip(items, plan, strict=True):
            d = int(target.dur_ns[i])
            for k, (path, frac, how, j) in enumerate(parts):
                rows_call.append(1 if k == 0 else 0)  # a kernel split over several modules is still one call
                rows_item.append(i)
                rows_path.append(path_id(path))
                rows_dur.append(int(round(d * frac)))
                rows_from.append(j)
                how_ns[how] += int(round(d * frac))
    outside = np.flatnonzero(target.step < 0)
    op_name, op_dims = _ops_through_map(target, target_trace, map_att, map_trace,
                                        np.array(rows_item, dtype=np.int64), np.array(rows_from, dtype=np.int64))
    items = np.concatenate([np.array(rows_item, dtype=np.int64), outside])
    dur = np.concatenate([np.array(rows_dur, dtype=np.int64), target.dur_ns[outside]])
    path = np.concatenate([np.array(rows_path, dtype=np.int64), target.path[outside]])
    total = sum(how_ns.values()) or 1
    stats = MapStats(source, how_ns[MATCHED] / total, how_ns[FILLED] / total, how_ns[ENCLOSED] / total,
                     len(map_seqs), replays, skipped)
    out = Attribution(
        basis=target.basis, granularity="module", name=target.name[items], kind=target.kind[items], dur_ns=dur,
        step=target.step[items], path=path, op=target.op[items], graph=target.graph[items], paths=paths,
        path_component=[component_name(p, "module") for p in paths], steps=target.steps, busy_ns=target.busy_ns, wall_ns=target.wall_ns,
        notes=map_notes(target.notes, stats),
        source=f"eager map {source}",
        ts_ns=None if target.ts_ns is None else target.ts_ns[items],
        op_name=np.concatenate([op_name, _column(target, target_trace, "op_name")[outside]]),
        op_dims=np.concatenate([op_dims, _column(target, target_trace, "op_dims")[outside]]),
        replay=None if target.replay is None else target.replay[items],
        calls=np.concatenate([np.array(rows_call, dtype=np.int64), np.ones(len(outside), dtype=np.int64)]),
    )
    return out, stats


def _eager_steps(map_att: Attribution, map_seqs: dict[int, list[int]],
                 source: str) -> tuple[dict[int, list[int]], int]:
    """The map's steps that ran eagerly, and how many did not: a step with kernels replayed from a CUDA graph
    or work inside a torch.compile region has no modules there to give. RooftopError when none is eager."""
    hidden_path = [bool(p) and (p[-1] == "cudaGraphLaunch" or any(seg.startswith(COMPILED_MARKERS) for seg in p))
                   for p in map_att.paths]
    why: set[str] = set()
    eager: dict[int, list[int]] = {}
    for s, items in map_seqs.items():
        graphed = bool(map_att.graph[items].any())
        compiled = any(hidden_path[p] for p in np.unique(map_att.path[items]).tolist()) and not graphed
        if graphed or compiled:
            why.add("CUDA-graph replays" if graphed else "a torch.compile graph")
            continue
        eager[s] = items
    if not eager:
        raise RooftopError(
            f"the eager map {source} is not eager: its steps ran {' and '.join(sorted(why))}, inside which the "
            "modules it is meant to give are not seen",
            "capture the map with graphs and compilation off: the embedded engine's /start_profile "
            "{\"eager\": true}, vLLM --enforce-eager, SGLang --disable-cuda-graph")
    return eager, len(map_seqs) - len(eager)


def _units(target: Attribution, tgt_seqs: dict[int, list[int]], target_trace: Trace,
           source: str) -> tuple[list[tuple[str, list[int]]], int]:
    """What is aligned with one map step, each with its label: the target's steps (a graph-replay trace with
    no marks has one a launch, steps.py). A trace without steps (the whole trace is one "step": no marks and
    fewer than two graph launches) is aligned piece by piece instead: each CUDA-graph replay (the kernels
    of one graph launch) and each run of kernels between replays; a whole trace of several steps aligned
    with one map step would match its first step and misplace the rest. Also how many replays there were."""
    if target.steps:
        return [(target.steps[s].label, items) for s, items in tgt_seqs.items()], 0
    items = [i for seq in tgt_seqs.values() for i in seq]
    if not items:
        return [], 0
    replay = target.replay if target.replay is not None else np.full(len(target.step), -1, dtype=np.int64)
    if not (replay[items] >= 0).any():
        raise RooftopError(
            f"the trace {target_trace.path} has no steps to align with the eager map {source}: no ProfilerStep#N, no "
            "repeated record_function range and no CUDA-graph replays to align one by one",
            "profile with torch.profiler's schedule (ProfilerStep#N: call prof.step() every step) or wrap each step "
            "in torch.profiler.record_function(\"step\")")
    units: list[list[int]] = []
    by_replay: dict[int, list[int]] = {}
    run: list[int] | None = None  # the current run of kernels outside graphs
    for i in items:
        r = int(replay[i])
        if r < 0:
            if run is None:
                run = []
                units.append(run)
            run.append(i)
            continue
        run = None
        unit = by_replay.get(r)
        if unit is None:
            unit = by_replay[r] = []
            units.append(unit)
        unit.append(i)
    return [("", u) for u in units], len(by_replay)


def map_notes(notes: list[str], stats: MapStats) -> list[str]:
    """A trace's notes once the map has placed its items: what the map replaced no longer holds."""
    out = []
    for note in notes:
        if "no module stacks" in note or ("has no CPU ops" in note and stats.matched_share + stats.filled_share > 0):
            continue  # the map's modules, ops and shapes stand in for them
        if "ran as CUDA-graph replays" in note:
            note = (note.split(", which record")[0] + f": through the eager map, those matched op for op "
                    f"({stats.matched_share:.0%} of the step's time) take their eager twin's module, op and shapes; "
                    f"fused or split ones ({stats.filled_share:.0%}) share the modules and take the op and shapes of "
                    f"the eager ops they replaced; those with no eager counterpart ({stats.enclosed_share:.0%}) take "
                    "only the module enclosing their neighbours, no op or shapes")
        out.append(note)
    return out + [stats.note()]


def _column(att: Attribution, trace: Trace, field: str) -> np.ndarray:
    """Per item: its CPU op's name (or Input Dims) as an index into the trace's tables, -1 without one."""
    own = getattr(att, field)
    if own is not None:
        return own
    table = trace.ops.name if field == "op_name" else trace.ops.dims
    return np.where(att.op >= 0, table[np.clip(att.op, 0, None)], -1) if len(table) else np.full(len(att.op), -1)


def _ops_through_map(target: Attribution, target_trace: Trace, map_att: Attribution, map_trace: Trace,
                     rows_item: np.ndarray, rows_from: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's CPU op (name and Input Dims): its own where it has one, else its eager counterpart's, so
    that a kernel replayed from a CUDA graph (no CPU op of its own) carries the shapes its eager twin was
    launched with, and capacity findings see them. The map's names and shapes are added to the trace's."""
    name = _column(target, target_trace, "op_name")[rows_item] if len(rows_item) else np.zeros(0, np.int64)
    dims = _column(target, target_trace, "op_dims")[rows_item] if len(rows_item) else np.zeros(0, np.int64)
    map_name, map_dims = _column(map_att, map_trace, "op_name"), _column(map_att, map_trace, "op_dims")
    name_ids = {n: i for i, n in enumerate(target_trace.names)}
    shape_ids = {sh: i for i, sh in enumerate(target_trace.shapes)}

    def intern(value, table: list, ids: dict) -> int:
        idx = ids.get(value)
        if idx is None:
            idx = ids[value] = len(table)
            table.append(value)
        return idx

    # a replayed kernel's own "op" is the graph's replay call: its eager twin's op is the one it runs
    borrow = ((name < 0) | target.graph[rows_item]) & (rows_from >= 0) if len(rows_item) else np.zeros(0, bool)
    for r in np.flatnonzero(borrow).tolist():
        j = int(rows_from[r])
        if map_name[j] >= 0:
            name[r] = intern(map_trace.names[int(map_name[j])], target_trace.names, name_ids)
        if map_dims[j] >= 0:
            dims[r] = intern(map_trace.shapes[int(map_dims[j])], target_trace.shapes, shape_ids)
    return name, dims


def _align(names: list[str], map_items: list[int], map_names: list[str],
           map_att: Attribution) -> list[list[tuple[tuple[str, ...], float, str, int]]]:
    """For each target item of one step: [(module path, share of its time, how, the map item whose CPU op
    it takes, or -1)]."""
    ref = [map_names[j] for j in map_items]
    ref_path = [map_att.paths[int(map_att.path[j])] for j in map_items]
    ref_dur = [max(int(map_att.dur_ns[j]), 1) for j in map_items]
    plan: list[list[tuple[tuple[str, ...], float, str, int]]] = [[] for _ in names]
    ops = SequenceMatcher(None, names, ref, autojunk=False).get_opcodes()
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            for k in range(i2 - i1):
                plan[i1 + k] = [(ref_path[j1 + k], 1.0, MATCHED, map_items[j1 + k])]
        elif tag in ("replace", "delete"):  # difflib turns `names` into `ref`: "delete" = target items only
            if j2 > j1:
                weight: dict[tuple[str, ...], int] = {}
                longest: dict[tuple[str, ...], int] = {}  # per path, its longest eager item: the op it stands for
                for j in range(j1, j2):
                    weight[ref_path[j]] = weight.get(ref_path[j], 0) + ref_dur[j]
                    if ref_path[j] not in longest or ref_dur[j] > ref_dur[longest[ref_path[j]]]:
                        longest[ref_path[j]] = j
                total = sum(weight.values())
                parts = [(p, w / total, FILLED, map_items[longest[p]]) for p, w in weight.items()]
            else:
                before = ref_path[j1 - 1] if j1 > 0 else ()
                after = ref_path[j1] if j1 < len(ref_path) else ()
                parts = [(_common_prefix(before, after) if before and after else before or after, 1.0, ENCLOSED, -1)]
            for i in range(i1, i2):
                plan[i] = parts
    return plan
