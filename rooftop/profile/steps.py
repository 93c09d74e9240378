"""Find a trace's steps: ProfilerStep#N ranges, a repeated record_function range, root-module calls, or
CUDA-graph launches.

Annotations (record_function ranges: a few a step) are read whole; nn.Module ranges are streamed a
block at a time, keeping one open-range end per thread.
"""

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from rooftop.profile.spill import time_blocks
from rooftop.profile.trace import Trace, is_graph_launch

STEP_PREFIX = "ProfilerStep#"


@dataclass(slots=True)
class Step:
    """One profiled step: a CPU time range (ns) and its label."""

    start_ns: int
    end_ns: int
    label: str


def label_phase(label: str) -> str:
    """A step label without its numbers: `ProfilerStep#7` and vLLM's `execute_context_0(0)_generation_2(2)`
    number the step or count its batch, which changes from step to step; what is left names the kind of step."""
    return _NUMBER.sub("", label)


_NUMBER = re.compile(r"\d+")


@dataclass(slots=True)
class FoundSteps:
    """A trace's steps, the label phase (label_phase) of the ranges they came from, and notes on them."""

    steps: list[Step]
    phase: str | None  # None: steps from root-module calls, or none found
    notes: list[str]


def find_steps(trace: Trace) -> FoundSteps:
    """Steps, first found of: ProfilerStep#N ranges, a repeated record_function range (ranges whose labels
    differ only in numbers count as one: vLLM names each step by its batch), repeated root-module calls
    (each step runs from one call of the model to the next), repeated CUDA-graph launches (the same, from
    one launch to the next: a graph replay has no module frames).
    """
    ann = trace.annotations
    names = [trace.names[n] for n in ann.name]
    phases = [label_phase(n) for n in names]
    outside = ~_inside_modules(trace, ann.ts_ns, ann.ts_ns + ann.dur_ns, ann.thread)
    phase = STEP_PREFIX if any(n.startswith(STEP_PREFIX) for n in names) else _most_time_repeated(phases, ann, outside)
    if phase is None:
        roots = _root_module_steps(trace)
        if roots:
            return FoundSteps(roots, None, [])
        launches = _graph_launch_steps(trace)
        if not launches:
            return FoundSteps([], None, [])
        return FoundSteps(launches, None, [
            f"no ProfilerStep#N, repeated record_function range or root-module call: each of the {len(launches)} "
            "CUDA-graph launches counts as one step (a replayed decode step is one launch; an engine that "
            "launches several graphs a step, such as piecewise graphs, needs its steps marked with "
            "torch.profiler's step() or a record_function range)"])
    picked = [i for i, p in enumerate(phases) if p == phase]
    steps = sorted((Step(int(ann.ts_ns[i]), int(ann.ts_ns[i] + ann.dur_ns[i]), names[i]) for i in picked),
                   key=lambda s: s.start_ns)
    return FoundSteps(steps, phase, _left_out(steps, names, phases, phase, ann, outside))


def _left_out(steps: list[Step], names: list[str], phases: list[str], phase: str, ann, outside) -> list[str]:
    """A note on the record_function ranges outside every module and every step: their work is in no step."""
    others = [i for i, p in enumerate(phases) if p != phase and outside[i]]
    if not others:
        return []
    at = step_of(ann.ts_ns[others], steps)
    left = [others[k] for k in np.flatnonzero(at < 0).tolist()]
    if not left:
        return []
    kinds = list(dict.fromkeys(names[i] for i in left))
    listed = ", ".join(f"'{n}'" for n in kinds[:3]) + (f" and {len(kinds) - 3} more" if len(kinds) > 3 else "")
    return [f"{len(left)} record_function range(s) outside the steps ({listed}) are left out of every step; "
            f"the steps are the {len(steps)} ranges named like '{steps[0].label}'"]


def step_of(ts_ns: np.ndarray, steps: list[Step]) -> np.ndarray:
    """Index of the step whose range holds each timestamp, -1 when none (or 0 without steps)."""
    if not steps:
        return np.zeros(len(ts_ns), dtype=np.int64)
    starts = np.array([s.start_ns for s in steps], dtype=np.int64)
    ends = np.array([s.end_ns for s in steps], dtype=np.int64)
    idx = np.searchsorted(starts, ts_ns, side="right") - 1
    ok = (idx >= 0) & (ts_ns < ends[np.clip(idx, 0, None)])
    return np.where(ok, idx, -1)


def _most_time_repeated(phases: list[str], ann, outside: np.ndarray) -> str | None:
    """The repeated record_function range (by label phase) with the most time that no nn.Module encloses (a
    step runs the model; a range inside a module, such as one per layer, is a part of a step)."""
    counts: Counter = Counter()
    total_ns: Counter = Counter()
    for p, d, ok in zip(phases, ann.dur_ns.tolist(), outside.tolist(), strict=True):
        if ok:
            counts[p] += 1
            total_ns[p] += d
    repeated = [p for p, c in counts.items() if c >= 2]
    return max(repeated, key=lambda p: total_ns[p]) if repeated else None


def _inside_modules(trace: Trace, starts: np.ndarray, ends: np.ndarray, threads: np.ndarray) -> np.ndarray:
    """For each interval: does an nn.Module range on its thread enclose it? (one pass over the modules)"""
    inside = np.zeros(len(starts), dtype=bool)
    if not len(starts) or not trace.count("modules"):
        return inside
    reach: dict[int, int] = {}  # per thread: the latest end of the modules read so far
    prev_t = -(1 << 62)
    for t, [(m, _)] in time_blocks([trace.tables["modules"].reader()]):
        # intervals that start in [prev_t, t): every module starting at or before them is read by now
        now = (starts >= prev_t) & (starts < t)
        for th in np.unique(np.concatenate([m["thread"], threads[now]])).tolist():
            mine = m[m["thread"] == th]
            mine = mine[np.argsort(mine["ts_ns"], kind="stable")]
            sel = np.flatnonzero(now & (threads == th))
            if not len(mine):
                inside[sel] = (th in reach) & (reach.get(th, -1) >= ends[sel])
                continue
            block_reach = np.maximum.accumulate(mine["ts_ns"] + mine["dur_ns"])
            if th in reach:
                block_reach = np.maximum(block_reach, reach[th])
            idx = np.searchsorted(mine["ts_ns"], starts[sel], side="right") - 1
            at = np.where(idx >= 0, block_reach[np.clip(idx, 0, None)], reach.get(th, -1))
            inside[sel] = ((idx >= 0) | (th in reach)) & (at >= ends[sel])
            reach[th] = int(block_reach[-1])
        prev_t = t
        after = starts >= t
    for i in np.flatnonzero(after).tolist():  # after every module's start: the modules' latest end decides
        inside[i] = int(threads[i]) in reach and reach[int(threads[i])] >= ends[i]
    return inside


def _root_module_steps(trace: Trace) -> list[Step]:
    """Calls of the outermost module with the most time; a step lasts until the next call."""
    if trace.count("modules") < 2:
        return []
    ends: dict[int, int] = {}  # per thread: end of the open root call
    roots: list[tuple[int, int, int, int]] = []  # (thread, name, ts, dur)
    for _, [(m, _)] in time_blocks([trace.tables["modules"].reader()]):
        order = np.lexsort((-m["dur_ns"], m["ts_ns"], m["thread"]))
        for th, name, ts, dur in zip(m["thread"][order].tolist(), m["name"][order].tolist(),
                                     m["ts_ns"][order].tolist(), m["dur_ns"][order].tolist(), strict=True):
            if ts >= ends.get(th, -1):
                roots.append((th, name, ts, dur))
                ends[th] = ts + dur
    total_ns: Counter = Counter()
    for th, name, _, dur in sorted(roots, key=lambda r: (r[0], r[2])):  # thread by thread: ties go to the first
        total_ns[(th, name)] += dur
    key = max(total_ns, key=total_ns.get)
    calls = sorted(ts for th, name, ts, _ in roots if (th, name) == key)
    if len(calls) < 2:
        return []
    return _until_next(calls, max(trace.tables[t].max_end_ns for t in ("ops", "modules")), trace.names[key[1]])


def _until_next(starts: list[int], trace_end: int, label: str) -> list[Step]:
    """Steps that each last from one of `starts` (sorted) to the next, the last to the trace's end."""
    return [Step(s, e, label) for s, e in zip(starts, starts[1:] + [trace_end], strict=True)]


def _graph_launch_steps(trace: Trace) -> list[Step]:
    """The CUDA-graph launches (cudaGraphLaunch, cuGraphLaunch) of the thread with the most of them, two or
    more: a step lasts from one launch until the next (host work between them belongs to the first)."""
    ids = np.array([i for i, n in enumerate(trace.names) if is_graph_launch(n)], dtype=np.int64)
    if not len(ids) or trace.count("launches") < 2:
        return []
    calls: dict[int, list[int]] = {}
    for _, [(launch, _)] in time_blocks([trace.tables["launches"].reader()]):
        mine = np.isin(launch["name"], ids)
        for th, ts in zip(launch["thread"][mine].tolist(), launch["ts_ns"][mine].tolist(), strict=True):
            calls.setdefault(th, []).append(ts)
    if not calls:
        return []
    thread = max(calls, key=lambda th: (len(calls[th]), -th))
    starts = sorted(calls[thread])
    if len(starts) < 2:
        return []
    return _until_next(starts, max(trace.tables[t].max_end_ns for t in ("ops", "launches")), "cudaGraphLaunch")
