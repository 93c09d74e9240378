"""Attribute device time to code: kernel -> launch -> CPU op -> enclosing nn.Module / record_function.

Joins follow Kineto: a kernel's `correlation` names its launch; the launch's `External id` names the
CPU op; the op's module path is the stack of `nn.Module` python_function events and record_function
ranges open on the launching thread when it ran. Kernels replayed from a CUDA graph share the
graph launch's correlation and are attributed as one block. A trace without kernels attributes the
CPU ops' self time instead.

The trace is streamed in time blocks (`attribute_stream`): one sweep per thread, whose open module
and op stacks carry from block to block, and a window of the launches of the last `HORIZON_NS` that
the kernels are joined to. Memory is a block, the stacks and the window, whatever the trace's size.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rooftop.profile.components import component_of
from rooftop.profile.spill import END_NS, TableReader, time_blocks
from rooftop.profile.steps import STEP_PREFIX, Step, find_steps, label_phase, step_of
from rooftop.profile.trace import Trace, is_graph_launch

# A kernel runs within this time of its launch: CUDA queues about a thousand launches, so a GPU
# that far behind the host is not a serving engine's. A kernel later than that counts as unlaunched.
HORIZON_NS = 10_000_000_000

__all__ = ["Attribution", "Step", "attribute", "attribute_stream", "component_name", "find_steps"]


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
    ts_ns: np.ndarray | None = None  # per item: its start (a kernel's on the GPU clock)
    op_name: np.ndarray | None = None  # per item: its CPU op's name (index into trace.names), -1 without
    op_dims: np.ndarray | None = None  # per item: its CPU op's Input Dims (index into trace.shapes), -1 without
    replay: np.ndarray | None = None  # per item: the correlation of the graph launch that replayed it, -1 if none
    devices: int = 1  # GPUs whose kernels ran in the steps: busy_ns is the mean over them
    calls: np.ndarray | None = None  # per item: 1 for a call, 0 for a further part of one split over paths (None: all 1)


ITEM_FIELDS = ("name", "kind", "dur_ns", "step", "path", "op", "graph", "ts_ns", "op_name", "op_dims", "replay")
# each(chunk of items, their rows in the kernels or ops table, time before which every step is complete)
OnChunk = Callable[[Attribution, np.ndarray, int], None]


def attribute(trace: Trace) -> Attribution:
    """Join every kernel (or CPU op) to its step, module path and CPU op; items in table order.

    Holds every item: memory grows with the trace. `analyze` streams (`attribute_stream`) instead."""
    chunks: list[Attribution] = []
    rows: list[np.ndarray] = []

    def keep(chunk: Attribution, item_rows: np.ndarray, _done_ns: int) -> None:
        chunks.append(chunk)
        rows.append(item_rows)

    att = attribute_stream(trace, keep)
    if chunks:
        order = np.argsort(np.concatenate(rows), kind="stable")
        for f in ITEM_FIELDS:
            setattr(att, f, np.concatenate([getattr(c, f) for c in chunks])[order])
    return att


def component_name(path: tuple[str, ...], granularity: str) -> str:
    """The component of an attribution path: a CUDA-graph block, an op name (op granularity), or by modules."""
    if path and path[-1] == "cudaGraphLaunch":
        return "cuda_graph"
    if granularity == "op":
        return path[0].split(" [", 1)[0] if path else "other"
    return component_of(path)


def attribute_stream(trace: Trace, each: OnChunk) -> Attribution:
    """Attribute the trace block by block, handing each block's items to `each`; returns the whole
    trace's steps, paths, per-step busy and wall time and notes (with no items)."""
    found = find_steps(trace)
    steps = found.steps
    names = trace.names
    keep_ann = {n for n in trace.tables["annotations"].name_ids
                if not (names[n].startswith(STEP_PREFIX) or label_phase(names[n]) == found.phase)}
    has_modules = trace.count("modules") > 0 or bool(keep_ann)
    granularity = "module" if has_modules else "op"
    notes: list[str] = [*trace.notes, *found.notes]
    if not has_modules:
        notes.append(
            "the trace has no module stacks (profile with with_stack=True, with_modules=True): time is "
            "attributed to CPU op names and input shapes, which is coarser than per-module attribution"
        )
    basis = "kernels" if trace.has_kernels else "cpu_ops"
    devices = 1
    sweep = _Sweep(trace, steps, keep_ann, has_modules, emit_ops=basis == "cpu_ops")
    join = _KernelJoin(trace, steps, sweep.paths) if basis == "kernels" else None
    kernels = trace.tables["kernels"].reader()
    readers = [trace.tables[t].reader() for t in ("modules", "annotations", "ops", "launches")]
    prev_t = -END_NS
    for t, (mods, anns, ops, launches) in time_blocks(readers):
        sweep.block(mods, anns, ops, launches)
        if join is not None:
            join.add_launches(sweep.take_launches())
            join.kernels_before(kernels, prev_t, each)  # one block behind: their launches are all read
        else:
            sweep.emit(each, min(t, sweep.open_since_ns()))
        prev_t = t
    sweep.finish()
    if join is not None:
        join.kernels_before(kernels, END_NS, each)
        busy, wall = join.busy.per_step(max(len(steps), 1))
        devices = join.busy.devices()
        notes += join.notes(trace)
    else:
        sweep.emit(each, END_NS)
        notes.append(
            "the trace has no GPU kernels: shares are of CPU op self time (the time in each op minus its "
            "child ops), not GPU time"
        )
        busy = sweep.busy_ns
        if steps:
            wall = np.array([s.end_ns - s.start_ns for s in steps], dtype=np.int64)
        else:
            ops = trace.tables["ops"]
            wall = np.array([ops.max_end_ns - ops.min_ts_ns], dtype=np.int64)
        wall = np.maximum(wall, busy)
    if not steps:
        notes.append("no ProfilerStep#N or repeated record_function range: the whole trace counts as one step")
    empty = np.zeros(0, dtype=np.int64)
    return Attribution(
        basis=basis, granularity=granularity, name=empty, kind=empty, dur_ns=empty, step=empty, path=empty,
        op=empty, graph=np.zeros(0, dtype=bool), paths=sweep.paths,
        path_component=[component_name(p, granularity) for p in sweep.paths], steps=steps, busy_ns=busy,
        wall_ns=wall, notes=notes, source="nn.Module frames" if has_modules else "CPU op names and shapes",
        ts_ns=empty, op_name=empty, op_dims=empty, replay=empty, devices=devices,
    )


# an open op: [end_ns, row in the ops table, name, dims, path, self_ns, start_ns, external id]
_END, _ROW, _NAME, _DIMS, _PATH, _SELF, _START, _EXT = range(8)


class _Sweep:
    """One time-ordered pass per thread over module ranges, annotations, ops and launches.

    Gives each op its enclosing container path and self time, and each launch its CPU op (by External
    id, else the innermost open op) and path. Containers are nn.Module ranges and record_function
    ranges other than the steps. Each thread's open containers and ops carry over to the next block.
    """

    def __init__(self, trace: Trace, steps: list[Step], keep_ann: set[int], has_modules: bool, emit_ops: bool):
        self.names, self.shapes, self.steps = trace.names, trace.shapes, steps
        self.keep_ann = np.fromiter(keep_ann, dtype=np.int64, count=len(keep_ann))
        self.has_modules, self.emit_ops = has_modules, emit_ops
        self.paths: list[tuple[str, ...]] = [()] if has_modules else [("(no CPU op)",)]
        self.path_ids: dict[tuple[int, int], int] = {}
        self.threads: dict[int, tuple[list, list]] = {}  # thread -> (open containers, open ops)
        self.by_ext: dict[int, list] = {}
        self.closed: list[list] = []  # ops closed in this block and the last: their External ids expire
        self.closed_before: list[list] = []
        self.graph_name: dict[int, bool] = {}
        self.launches: list[list] = []
        self.ops_done: list[list] = []
        self.busy_ns = np.zeros(max(len(steps), 1), dtype=np.int64)

    def _op_path(self, name: int, dims: int) -> int:
        """Without module stacks: one path per (op name, input shapes)."""
        pid = self.path_ids.get((name, dims))
        if pid is None:
            pid = self.path_ids[(name, dims)] = len(self.paths)
            shape = "" if dims < 0 else " " + _shape_text(self.shapes[dims])
            self.paths.append((self.names[name] + shape,))
        return pid

    def _close(self, op: list) -> None:
        self.closed.append(op)
        if self.emit_ops:
            self.ops_done.append(op)

    def block(self, mods, anns, ops, launches) -> None:
        """Sweep one time block: (rows, row numbers) of each table, all rows before the same time."""
        (m, _), (a, _), (o, o_rows), (ln, _) = mods, anns, ops, launches
        a = a[np.isin(a["name"], self.keep_ann)]
        # kind: 0 container, 1 op, 2 launch (containers first on ties so they enclose what starts with them)
        parts = (m, a, o, ln)
        thread = np.concatenate([p["thread"] for p in parts])
        ts = np.concatenate([p["ts_ns"] for p in parts])
        dur = np.concatenate([p["dur_ns"] for p in parts])
        name = np.concatenate([p["name"] for p in parts])
        kind = np.concatenate([np.full(len(p), k, dtype=np.int64) for p, k in zip(parts, (0, 0, 1, 2), strict=True)])
        index = np.concatenate([np.arange(len(p)) for p in parts])
        order = np.lexsort((kind, -dur, ts, thread))
        th_l, ts_l, dur_l, name_l, kind_l, idx_l = (
            thread.tolist(), ts.tolist(), dur.tolist(), name.tolist(), kind.tolist(), index.tolist()
        )
        o_row, o_ext, o_dims = o_rows.tolist(), o["external_id"].tolist(), o["dims"].tolist()
        l_corr, l_ext = ln["correlation"].tolist(), ln["external_id"].tolist()
        names, paths, path_ids, by_ext, threads = self.names, self.paths, self.path_ids, self.by_ext, self.threads
        has_modules, graph_name, out = self.has_modules, self.graph_name, self.launches
        current, containers, open_ops = None, [], []
        for i in order.tolist():
            t, s = th_l[i], ts_l[i]
            if t != current:
                current = t
                containers, open_ops = threads.setdefault(t, ([], []))
            while containers and containers[-1][0] <= s:
                containers.pop()
            while open_ops and open_ops[-1][_END] <= s:
                self._close(open_ops.pop())
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
                j, d = idx_l[i], dur_l[i]
                if open_ops:
                    open_ops[-1][_SELF] -= d
                op_path = path if has_modules else self._op_path(name_l[i], o_dims[j])
                op = [s + d, o_row[j], name_l[i], o_dims[j], op_path, d, s, o_ext[j]]
                open_ops.append(op)
                if o_ext[j] >= 0:
                    by_ext[o_ext[j]] = op
            else:
                j, n = idx_l[i], name_l[i]
                op = by_ext.get(l_ext[j]) if l_ext[j] >= 0 else None  # External id first, nesting as fallback
                if op is None and open_ops:
                    op = open_ops[-1]
                graph = graph_name.get(n)
                if graph is None:
                    graph = graph_name[n] = is_graph_launch(names[n])
                if op is None:
                    out.append((l_corr[j], s, path if has_modules else 0, -1, -1, -1, graph))
                else:
                    out.append((l_corr[j], s, op[_PATH], op[_ROW], op[_NAME], op[_DIMS], graph))
        # An External id names an op that encloses its launches: once the op has closed, a block
        # later, no launch can name it.
        for op in self.closed_before:
            if by_ext.get(op[_EXT]) is op:
                del by_ext[op[_EXT]]
        self.closed_before, self.closed = self.closed, []

    def take_launches(self) -> dict[str, np.ndarray]:
        cols = list(zip(*self.launches, strict=True)) if self.launches else [()] * 7
        self.launches = []
        out = {c: np.array(v, dtype=np.int64) for c, v in
               zip(("correlation", "ts_ns", "path", "op", "op_name", "op_dims"), cols[:6], strict=True)}
        out["graph"] = np.array(cols[6], dtype=bool)
        return out

    def open_since_ns(self) -> int:
        """The start of the earliest op still open: ops from then on may not have their self time yet."""
        return min((ops[0][_START] for _, ops in self.threads.values() if ops), default=END_NS)

    def finish(self) -> None:
        """Close the ops still open at the end of the trace."""
        for _, ops in self.threads.values():
            while ops:
                self._close(ops.pop())

    def emit(self, each: OnChunk, done_ns: int) -> None:
        """Hand the ops closed so far to `each` as items (traces without kernels)."""
        if not self.ops_done:
            return
        row, name, ts, self_ns, path, dims = (
            np.array(c, dtype=np.int64) for c in zip(*((op[_ROW], op[_NAME], op[_START], op[_SELF], op[_PATH],
                                                        op[_DIMS]) for op in self.ops_done), strict=True)
        )
        self.ops_done = []
        self_ns = np.maximum(self_ns, 0)
        step = step_of(ts, self.steps)
        inside = step >= 0
        self.busy_ns += np.bincount(step[inside], weights=self_ns[inside], minlength=len(self.busy_ns)).astype(np.int64)
        n = len(row)
        chunk = Attribution(
            basis="cpu_ops", granularity="", name=name, kind=np.zeros(n, dtype=np.int64), dur_ns=self_ns, step=step,
            path=path, op=row, graph=np.zeros(n, dtype=bool), paths=self.paths, path_component=[], steps=self.steps,
            busy_ns=self.busy_ns, wall_ns=self.busy_ns, ts_ns=ts, op_name=name, op_dims=dims,
            replay=np.full(n, -1, dtype=np.int64),
        )
        each(chunk, row, done_ns)


def _shape_text(dims: tuple) -> str:
    parts = ["x".join(str(x) for x in d) if isinstance(d, tuple) else str(d) for d in dims if d != ()]
    return "[" + ", ".join(parts) + "]"


class _KernelJoin:
    """Joins kernels to the launches of the last HORIZON_NS (by correlation) and adds up GPU busy time."""

    def __init__(self, trace: Trace, steps: list[Step], paths: list[tuple[str, ...]]):
        self.steps, self.paths = steps, paths
        self.window: dict[str, np.ndarray] | None = None  # launches sorted by correlation
        self.busy = _Busy()
        self.block_paths: dict[int, int] = {}
        self.no_launch_path = -1
        self.kernels = self.missing = self.graph_kernels = self.graph_ns = 0

    def add_launches(self, launches: dict[str, np.ndarray]) -> None:
        if not len(launches["correlation"]):
            return
        if self.window is not None:
            launches = {c: np.concatenate([self.window[c], v]) for c, v in launches.items()}
        order = np.argsort(launches["correlation"], kind="stable")
        self.window = {c: v[order] for c, v in launches.items()}

    def kernels_before(self, reader: TableReader, t: int, each: OnChunk) -> None:
        """Join the kernels that start before `t`, a block at a time."""
        while not reader.done:
            h = min(reader.horizon(), t)
            h = max(h, min(reader.first_ts() + 1, t))  # a block of kernels all at one time is taken whole
            rows, index = reader.take_before(h)
            if len(rows):
                self._join(rows, index, each, h - HORIZON_NS)
            if self.window is not None:  # kernels from now on start after h: launches older than the horizon go
                keep = self.window["ts_ns"] >= h - HORIZON_NS
                if not keep.all():
                    self.window = {c: v[keep] for c, v in self.window.items()}
            if h >= t:
                return

    def _join(self, k: np.ndarray, rows: np.ndarray, each: OnChunk, done_ns: int) -> None:
        n = len(k)
        corr = k["correlation"]
        w = self.window
        if w is not None and len(w["correlation"]):
            pos = np.clip(np.searchsorted(w["correlation"], corr), 0, len(w["correlation"]) - 1)
            hit = w["correlation"][pos] == corr
        else:
            w = {c: np.zeros(1, dtype=bool if c == "graph" else np.int64)
                 for c in ("correlation", "ts_ns", "path", "op", "op_name", "op_dims", "graph")}
            pos, hit = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
        op = np.where(hit, w["op"][pos], -1)
        op_name = np.where(hit, w["op_name"][pos], -1)
        op_dims = np.where(hit, w["op_dims"][pos], -1)
        path = w["path"][pos]
        if not hit.all():
            if self.no_launch_path < 0:  # not "outside every module": nothing says where it came from
                self.no_launch_path = len(self.paths)
                self.paths.append(("(no launch event)",))
            path = np.where(hit, path, self.no_launch_path)
        graph = hit & w["graph"][pos]
        # A graph replay is one block: attribute it to where the graph was launched, marked as a graph.
        if graph.any():
            for i in np.flatnonzero(graph).tolist():
                base = int(path[i])
                pid = self.block_paths.get(base)
                if pid is None:
                    pid = self.block_paths[base] = len(self.paths)
                    self.paths.append(self.paths[base] + ("cudaGraphLaunch",))
                path[i] = pid
            self.graph_kernels += int(graph.sum())
            self.graph_ns += int(k["dur_ns"][graph].sum())
        self.kernels += n
        self.missing += int((~hit).sum())
        step = step_of(np.where(hit, w["ts_ns"][pos], k["ts_ns"]), self.steps)
        self.busy.add(k["ts_ns"], k["dur_ns"], k["device"], step)
        chunk = Attribution(
            basis="kernels", granularity="", name=k["name"].copy(), kind=k["kind"].copy(), dur_ns=k["dur_ns"].copy(),
            step=step, path=path, op=op, graph=graph, paths=self.paths, path_component=[], steps=self.steps,
            busy_ns=np.zeros(0, dtype=np.int64), wall_ns=np.zeros(0, dtype=np.int64), ts_ns=k["ts_ns"].copy(),
            op_name=op_name, op_dims=op_dims, replay=np.where(graph, corr, -1),
        )
        each(chunk, rows, done_ns)

    def notes(self, trace: Trace) -> list[str]:
        out = []
        if self.graph_kernels:
            out.append(
                f"{self.graph_kernels} kernels ({self.graph_ns / 1e6:.2f} ms) ran as CUDA-graph replays, which record "
                "no CPU op, shapes or module frames of their own: they are placed by kernel name where it names a "
                "component, the rest counts as cuda_graph; for modules and capacity findings pass --eager-trace "
                "with a trace of the same steps run without graphs (the embedded engine: /start_profile "
                "{\"eager\": true}; vLLM --enforce-eager; SGLang --disable-cuda-graph)"
            )
        if self.missing:
            out.append(f"{self.missing} of {self.kernels} kernels have no launch event in the trace and are left "
                       "unattributed")
        if trace.count("launches") and not trace.count("ops"):
            out.append("the trace has no CPU ops (record_shapes/CPU activity off): kernels are attributed by launch only")
        return out


class _Busy:
    """Per step: GPU busy (union of kernel intervals, averaged over devices) and wall time, from kernels
    that arrive in time order.

    Wall time runs on the GPU clock from a step's first kernel to the next step's first kernel (the
    last step ends at its last kernel), so idle gaps between launches count and CPU/GPU lag does not.
    """

    def __init__(self):
        self.groups: dict[tuple[int, int], list[int]] = {}  # (step, device) -> [reach, union ns, first, last]

    def add(self, ts: np.ndarray, dur: np.ndarray, device: np.ndarray, step: np.ndarray) -> None:
        keep = step >= 0
        order = np.lexsort((ts[keep], device[keep], step[keep]))
        s_ts, s_dev, s_step = ts[keep][order], device[keep][order], step[keep][order]
        s_end = s_ts + dur[keep][order]
        if not len(s_ts):
            return
        cuts = np.flatnonzero((np.diff(s_step) != 0) | (np.diff(s_dev) != 0)) + 1
        bounds = np.concatenate(([0], cuts, [len(s_ts)]))
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            key = (int(s_step[a]), int(s_dev[a]))
            g = self.groups.get(key)
            starts, ends = s_ts[a:b], s_end[a:b]
            reach = np.maximum.accumulate(ends)
            before = np.concatenate(([starts[0] if g is None else g[0]], reach[:-1]))
            if g is not None:
                before = np.maximum(before, g[0])
            union = int(np.clip(ends - np.maximum(starts, before), 0, None).sum())
            if g is None:
                self.groups[key] = [int(reach[-1]), union, int(starts[0]), int(reach[-1])]
            else:
                g[0], g[1], g[3] = max(g[0], int(reach[-1])), g[1] + union, max(g[3], int(reach[-1]))

    def devices(self) -> int:
        """How many GPUs ran kernels in the steps."""
        return max(len({dev for _, dev in self.groups}), 1)

    def per_step(self, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
        busy = np.zeros(n_steps, dtype=np.int64)
        first = np.full(n_steps, -1, dtype=np.int64)
        last = np.zeros(n_steps, dtype=np.int64)
        per_device: dict[int, list[int]] = {}
        for (st, _), (_, union, start, end) in self.groups.items():
            per_device.setdefault(st, []).append(union)
            first[st] = start if first[st] < 0 else min(first[st], start)
            last[st] = max(last[st], end)
        for st, unions in per_device.items():
            busy[st] = sum(unions) // len(unions)
        wall = np.zeros(n_steps, dtype=np.int64)
        later_first = -1
        for st in range(n_steps - 1, -1, -1):
            if first[st] < 0:
                continue
            wall[st] = (later_first if later_first >= 0 else last[st]) - first[st]
            later_first = int(first[st])
        return busy, np.maximum(wall, busy)
