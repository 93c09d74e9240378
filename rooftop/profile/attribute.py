"""Attribute device time to code: kernel -> launch -> CPU op -> enclosing nn.Module / record_function.

Joins follow Kineto: a kernel's `correlation` names its launch; the launch's `External id` names the
CPU op; the op's module path is the stack of `nn.Module` python_function events and record_function
ranges open on the launching thread when it ran. Kernels replayed from a CUDA graph share the
graph launch's correlation and are attributed as one block. A trace without kernels attributes the
CPU ops' self time instead.
"""

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from rooftop.profile.components import component_of
from rooftop.profile.trace import Trace

_STEP_PREFIX = "ProfilerStep#"


@dataclass(slots=True)
class Step:
    """One profiled step: a CPU time range (ns) and its label."""

    start_ns: int
    end_ns: int
    label: str


@dataclass(slots=True)
class Attribution:
    """Work items (kernels, or CPU ops' self time) with their step, code path and op."""

    basis: str  # "kernels" or "cpu_ops"
    granularity: str  # "module" (nn.Module / record_function paths) or "op" (CPU op names + shapes)
    name: np.ndarray  # index into trace.names: the kernel or op name
    kind: np.ndarray  # kernel kind (trace.KIND_*); 0 for CPU ops
    dur_ns: np.ndarray
    step: np.ndarray  # index into steps, -1 outside every step
    path: np.ndarray  # index into paths
    op: np.ndarray  # index into trace.ops, -1 when no CPU op was found
    graph: np.ndarray  # bool: replayed from a CUDA graph
    paths: list[tuple[str, ...]]
    path_component: list[str]
    steps: list[Step]
    busy_ns: np.ndarray  # per step: union of kernel time (or sum of CPU op self time)
    wall_ns: np.ndarray  # per step: wall time the busy time is compared with
    notes: list[str] = field(default_factory=list)
    source: str = ""  # where the module paths come from: module frames, op names, or an eager map


def find_steps(trace: Trace) -> tuple[list[Step], str | None]:
    """Steps, first found of: ProfilerStep#N ranges, a repeated record_function range, repeated
    root-module calls (each step runs from one call of the model to the next). Also the name used.
    """
    ann = trace.annotations
    names = [trace.names[n] for n in ann.name]
    picked = [i for i, n in enumerate(names) if n.startswith(_STEP_PREFIX)]
    step_name = _STEP_PREFIX if picked else _most_time_repeated(trace, names)
    if not picked and step_name is not None:
        picked = [i for i, n in enumerate(names) if n == step_name]
    if picked:
        steps = [Step(int(ann.ts_ns[i]), int(ann.ts_ns[i] + ann.dur_ns[i]), names[i]) for i in picked]
        return sorted(steps, key=lambda s: s.start_ns), step_name
    return _root_module_steps(trace), None


def _most_time_repeated(trace: Trace, names: list[str]) -> str | None:
    """The repeated record_function range with the most time that no nn.Module encloses (a step
    runs the model; a range inside a module, such as one per layer, is a part of a step)."""
    ann = trace.annotations
    outside = ~_inside_modules(trace, ann.ts_ns, ann.ts_ns + ann.dur_ns, ann.thread)
    counts: Counter = Counter()
    total_ns: Counter = Counter()
    for n, d, ok in zip(names, ann.dur_ns.tolist(), outside.tolist(), strict=True):
        if ok:
            counts[n] += 1
            total_ns[n] += d
    repeated = [n for n, c in counts.items() if c >= 2]
    return max(repeated, key=lambda n: total_ns[n]) if repeated else None


def _inside_modules(trace: Trace, starts: np.ndarray, ends: np.ndarray, threads: np.ndarray) -> np.ndarray:
    """For each interval: does an nn.Module range on its thread enclose it?"""
    m = trace.modules
    inside = np.zeros(len(starts), dtype=bool)
    for t in np.unique(threads).tolist():
        mine = m.thread == t
        if not mine.any():
            continue
        order = np.argsort(m.ts_ns[mine], kind="stable")
        m_start = m.ts_ns[mine][order]
        reach = np.maximum.accumulate((m.ts_ns + m.dur_ns)[mine][order])
        sel = threads == t
        idx = np.searchsorted(m_start, starts[sel], side="right") - 1
        inside[sel] = (idx >= 0) & (reach[np.clip(idx, 0, None)] >= ends[sel])
    return inside


def _root_module_steps(trace: Trace) -> list[Step]:
    """Calls of the outermost module with the most time; a step lasts until the next call."""
    m = trace.modules
    if len(m.name) < 2:
        return []
    order = np.lexsort((-m.dur_ns, m.ts_ns, m.thread))
    roots: list[int] = []
    end, thread = -1, -1
    for i in order.tolist():
        if m.thread[i] != thread or m.ts_ns[i] >= end:
            roots.append(i)
            thread, end = int(m.thread[i]), int(m.ts_ns[i] + m.dur_ns[i])
    total_ns: Counter = Counter()
    for i in roots:
        total_ns[(int(m.thread[i]), int(m.name[i]))] += int(m.dur_ns[i])
    key = max(total_ns, key=total_ns.get)
    calls = sorted(int(m.ts_ns[i]) for i in roots if (int(m.thread[i]), int(m.name[i])) == key)
    if len(calls) < 2:
        return []
    ends = [trace.ops.ts_ns + trace.ops.dur_ns, trace.modules.ts_ns + trace.modules.dur_ns]
    trace_end = int(max(int(e.max()) for e in ends if len(e)))
    label = trace.names[key[1]]
    return [Step(s, e, label) for s, e in zip(calls, calls[1:] + [trace_end], strict=True)]


def attribute(trace: Trace) -> Attribution:
    """Join every kernel (or CPU op) to its step, module path and CPU op."""
    steps, step_name = find_steps(trace)
    notes: list[str] = []
    op_path, op_self_ns, launch_op, launch_path, paths, has_modules = _sweep(trace, step_name)
    granularity = "module" if has_modules else "op"
    if not has_modules:
        paths, op_path, launch_path = _op_paths(trace)
        notes.append(
            "the trace has no module stacks (profile with with_stack=True, with_modules=True): time is "
            "attributed to CPU op names and input shapes, which is coarser than per-module attribution"
        )
    if trace.has_kernels:
        att = _attribute_kernels(trace, steps, op_path, launch_op, launch_path, paths, notes)
    else:
        notes.append(
            "the trace has no GPU kernels: shares are of CPU op self time (the time in each op minus its "
            "child ops), not GPU time"
        )
        att = _attribute_ops(trace, steps, op_path, op_self_ns, paths)
    att.granularity = granularity
    att.source = "nn.Module frames" if has_modules else "CPU op names and shapes"
    att.path_component = [component_name(p, granularity) for p in paths]
    att.notes = notes
    if not steps:
        att.notes.append("no ProfilerStep#N or repeated record_function range: the whole trace counts as one step")
    return att


def component_name(path: tuple[str, ...], granularity: str) -> str:
    """The component of an attribution path: a CUDA-graph block, an op name (op granularity), or by modules."""
    if path and path[-1] == "cudaGraphLaunch":
        return "cuda_graph"
    if granularity == "op":
        return path[0].split(" [", 1)[0] if path else "other"
    return component_of(path)


def _sweep(trace: Trace, step_name: str | None):
    """One pass per thread over modules, annotations, ops and launches in time order.

    Gives each op its enclosing container path and self time, and each launch its innermost op
    and path. Containers are nn.Module ranges and record_function ranges other than the steps.
    """
    names = trace.names
    ann = trace.annotations
    keep_ann = np.array(
        [not (names[n].startswith(_STEP_PREFIX) or names[n] == step_name) for n in ann.name], dtype=bool
    ) if len(ann.name) else np.zeros(0, dtype=bool)
    mods, ops, launches = trace.modules, trace.ops, trace.launches
    has_modules = len(mods.name) > 0 or bool(keep_ann.any())

    # kind: 0 container, 1 op, 2 launch (containers first on ties so they enclose what starts with them)
    parts = [
        (mods.thread, mods.ts_ns, mods.dur_ns, mods.name, 0, np.arange(len(mods.name))),
        (ann.thread[keep_ann], ann.ts_ns[keep_ann], ann.dur_ns[keep_ann], ann.name[keep_ann], 0,
         np.arange(int(keep_ann.sum()))),
        (ops.thread, ops.ts_ns, ops.dur_ns, ops.name, 1, np.arange(len(ops.name))),
        (launches.thread, launches.ts_ns, launches.dur_ns, launches.name, 2, np.arange(len(launches.name))),
    ]
    thread = np.concatenate([p[0] for p in parts])
    ts = np.concatenate([p[1] for p in parts])
    dur = np.concatenate([p[2] for p in parts])
    name = np.concatenate([p[3] for p in parts])
    kind = np.concatenate([np.full(len(p[0]), p[4], dtype=np.int64) for p in parts])
    index = np.concatenate([p[5] for p in parts])
    order = np.lexsort((kind, -dur, ts, thread))

    n_ops = len(ops.name)
    op_path = np.zeros(n_ops, dtype=np.int64)
    op_self = ops.dur_ns.copy()
    launch_op = np.full(len(launches.name), -1, dtype=np.int64)
    launch_path = np.zeros(len(launches.name), dtype=np.int64)
    paths: list[tuple[str, ...]] = [()]
    path_ids: dict[tuple[int, int], int] = {}

    containers: list[tuple[int, int]] = []  # (end_ns, path id)
    open_ops: list[tuple[int, int]] = []  # (end_ns, op index)
    current = None
    th_l, ts_l, dur_l, name_l, kind_l, idx_l = (
        thread.tolist(), ts.tolist(), dur.tolist(), name.tolist(), kind.tolist(), index.tolist()
    )
    for i in order.tolist():
        t, s = th_l[i], ts_l[i]
        if t != current:
            current, containers, open_ops = t, [], []
        while containers and containers[-1][0] <= s:
            containers.pop()
        while open_ops and open_ops[-1][0] <= s:
            open_ops.pop()
        path = containers[-1][1] if containers else 0
        k = kind_l[i]
        if k == 0:
            key = (path, name_l[i])
            pid = path_ids.get(key)
            if pid is None:
                pid = path_ids[key] = len(paths)
                paths.append(paths[path] + (names[name_l[i]],))
            containers.append((s + dur_l[i], pid))
        elif k == 1:
            j = idx_l[i]
            op_path[j] = path
            if open_ops:
                op_self[open_ops[-1][1]] -= dur_l[i]
            open_ops.append((s + dur_l[i], j))
        else:
            j = idx_l[i]
            launch_path[j] = path
            if open_ops:
                launch_op[j] = open_ops[-1][1]
    np.maximum(op_self, 0, out=op_self)
    return op_path, op_self, launch_op, launch_path, paths, has_modules


def _op_paths(trace: Trace):
    """Without stacks: one path per (op name, input shapes), used for ops and for their launches."""
    ops = trace.ops
    paths: list[tuple[str, ...]] = [("(no CPU op)",)]
    ids: dict[tuple[int, int], int] = {}
    op_path = np.zeros(len(ops.name), dtype=np.int64)
    for j, (n, d) in enumerate(zip(ops.name.tolist(), ops.dims.tolist(), strict=True)):
        pid = ids.get((n, d))
        if pid is None:
            pid = ids[(n, d)] = len(paths)
            shape = "" if d < 0 else " " + _shape_text(trace.shapes[d])
            paths.append((trace.names[n] + shape,))
        op_path[j] = pid
    return paths, op_path, np.zeros(len(trace.launches.name), dtype=np.int64)


def _shape_text(dims: tuple) -> str:
    parts = ["x".join(str(x) for x in d) if isinstance(d, tuple) else str(d) for d in dims if d != ()]
    return "[" + ", ".join(parts) + "]"


def _step_of(ts_ns: np.ndarray, steps: list[Step]) -> np.ndarray:
    """Index of the step whose range holds each timestamp, -1 when none (or 0 without steps)."""
    if not steps:
        return np.zeros(len(ts_ns), dtype=np.int64)
    starts = np.array([s.start_ns for s in steps], dtype=np.int64)
    ends = np.array([s.end_ns for s in steps], dtype=np.int64)
    idx = np.searchsorted(starts, ts_ns, side="right") - 1
    ok = (idx >= 0) & (ts_ns < ends[np.clip(idx, 0, None)])
    return np.where(ok, idx, -1)


def _attribute_kernels(trace, steps, op_path, launch_op, launch_path, paths, notes) -> Attribution:
    k, launches, ops = trace.kernels, trace.launches, trace.ops
    by_corr = {c: i for i, c in enumerate(launches.correlation.tolist())}
    by_ext = {e: j for j, e in enumerate(ops.external_id.tolist()) if e >= 0}
    graph_launch = np.array(["GraphLaunch" in trace.names[n] for n in launches.name.tolist()], dtype=bool)

    n = len(k.name)
    launch_of = np.array([by_corr.get(c, -1) for c in k.correlation.tolist()], dtype=np.int64)
    has_launch = launch_of >= 0
    li = np.clip(launch_of, 0, None)
    op = np.full(n, -1, dtype=np.int64)
    if len(launches.name):
        ext_op = np.array([by_ext.get(e, -1) for e in launches.external_id.tolist()], dtype=np.int64)
        joined = np.where(ext_op >= 0, ext_op, launch_op)  # External id first, nesting as fallback
        op = np.where(has_launch, joined[li], -1)
    path = np.zeros(n, dtype=np.int64)
    if len(ops.name):
        path = np.where(op >= 0, op_path[np.clip(op, 0, None)], 0)
    if len(launches.name):
        path = np.where((op < 0) & has_launch, launch_path[li], path)
    if not has_launch.all():
        paths.append(("(no launch event)",))  # not "outside every module": nothing says where it came from
        path = np.where(has_launch, path, len(paths) - 1)
    graph = has_launch & graph_launch[li] if len(launches.name) else np.zeros(n, dtype=bool)

    # A graph replay is one block: attribute it to where the graph was launched, marked as a graph.
    if graph.any():
        block_paths: dict[int, int] = {}
        for i in np.flatnonzero(graph).tolist():
            base = int(path[i])
            pid = block_paths.get(base)
            if pid is None:
                pid = block_paths[base] = len(paths)
                paths.append(paths[base] + ("cudaGraphLaunch",))
            path[i] = pid
        graph_ms = k.dur_ns[graph].sum() / 1e6
        notes.append(
            f"{int(graph.sum())} kernels ({graph_ms:.2f} ms) were replayed from CUDA graphs and are attributed "
            "as one block to the code that launched the graph; profile with CUDA graphs off for per-module times"
        )
    missing = int((~has_launch).sum())
    if missing:
        notes.append(f"{missing} of {n} kernels have no launch event in the trace and are left unattributed")
    if len(launches.name) and not len(ops.name):
        notes.append("the trace has no CPU ops (record_shapes/CPU activity off): kernels are attributed by launch only")

    launch_ts = np.where(has_launch, launches.ts_ns[li] if len(launches.name) else 0, k.ts_ns)
    step = _step_of(launch_ts, steps)
    busy, wall = _gpu_busy(k.ts_ns, k.dur_ns, k.device, step, max(len(steps), 1))
    return Attribution(
        basis="kernels", granularity="", name=k.name, kind=k.kind, dur_ns=k.dur_ns, step=step, path=path,
        op=op, graph=graph, paths=paths, path_component=[], steps=steps, busy_ns=busy, wall_ns=wall,
    )


def _gpu_busy(ts, dur, device, step, n_steps):
    """Per step: GPU busy (union of kernel intervals, averaged over devices) and wall time.

    Wall time runs on the GPU clock from a step's first kernel to the next step's first kernel (the
    last step ends at its last kernel), so idle gaps between launches count and CPU/GPU lag does not.
    """
    busy = np.zeros(n_steps, dtype=np.int64)
    first = np.full(n_steps, -1, dtype=np.int64)
    last = np.zeros(n_steps, dtype=np.int64)
    keep = step >= 0
    order = np.lexsort((ts[keep], device[keep], step[keep]))
    s_ts, s_dev, s_step = ts[keep][order], device[keep][order], step[keep][order]
    s_end = s_ts + dur[keep][order]
    # one group per (step, device), contiguous after the sort
    cuts = np.flatnonzero((np.diff(s_step) != 0) | (np.diff(s_dev) != 0)) + 1
    bounds = np.concatenate(([0], cuts, [len(s_ts)])) if len(s_ts) else np.zeros(1, dtype=np.int64)
    group_ns: dict[int, list[int]] = {}
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        st = int(s_step[a])
        group_ns.setdefault(st, []).append(_union_ns(s_ts[a:b], s_end[a:b]))
        first[st] = s_ts[a] if first[st] < 0 else min(first[st], int(s_ts[a]))
        last[st] = max(last[st], int(s_end[a:b].max()))
    for st, per_device in group_ns.items():
        busy[st] = sum(per_device) // len(per_device)
    wall = np.zeros(n_steps, dtype=np.int64)
    later_first = -1
    for st in range(n_steps - 1, -1, -1):
        if first[st] < 0:
            continue
        wall[st] = (later_first if later_first >= 0 else last[st]) - first[st]
        later_first = int(first[st])
    return busy, np.maximum(wall, busy)


def _union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    """Length of the union of intervals sorted by start."""
    if len(starts) == 0:
        return 0
    prev_max = np.maximum.accumulate(ends)
    prev_max = np.concatenate(([starts[0]], prev_max[:-1]))
    return int(np.clip(ends - np.maximum(starts, prev_max), 0, None).sum())


def _attribute_ops(trace, steps, op_path, op_self_ns, paths) -> Attribution:
    ops = trace.ops
    step = _step_of(ops.ts_ns, steps)
    n_steps = max(len(steps), 1)
    busy = np.bincount(step[step >= 0], weights=op_self_ns[step >= 0], minlength=n_steps).astype(np.int64)
    if steps:
        wall = np.array([s.end_ns - s.start_ns for s in steps], dtype=np.int64)
    else:
        wall = np.array([int((ops.ts_ns + ops.dur_ns).max() - ops.ts_ns.min())], dtype=np.int64)
    return Attribution(
        basis="cpu_ops", granularity="", name=ops.name, kind=np.zeros(len(ops.name), dtype=np.int64),
        dur_ns=op_self_ns, step=step, path=op_path, op=np.arange(len(ops.name)),
        graph=np.zeros(len(ops.name), dtype=bool), paths=paths, path_component=[], steps=steps,
        busy_ns=busy, wall_ns=np.maximum(wall, busy),
    )
