"""A parsed profile in compact columns: kernels, launches, CPU ops, module and annotation ranges.

Both parsers (Kineto JSON, nsys SQLite) fill a `TraceBuilder`; analysis reads the frozen `Trace`.
Strings are interned once in `names`; every `*name` column holds an index into it. Times are int ns.
"""

from array import array
from dataclasses import dataclass, field

import msgspec
import numpy as np

from rooftop.profile.spill import Tables

KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET = 0, 1, 2


@dataclass(slots=True)
class Kernels:
    """GPU activity: kernels, memcpys and memsets (ns, on the GPU clock)."""

    name: np.ndarray
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    correlation: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    kind: np.ndarray


def is_graph_launch(name: str) -> bool:
    """Whether a runtime/driver call launches a CUDA graph (cudaGraphLaunch, cuGraphLaunch, an nsys
    export's versioned names such as cudaGraphLaunch_v10000)."""
    return "GraphLaunch" in name


@dataclass(slots=True)
class Launches:
    """CUDA runtime/driver calls that carry a correlation id (cudaLaunchKernel, cudaGraphLaunch, ...)."""

    name: np.ndarray
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    correlation: np.ndarray
    external_id: np.ndarray
    thread: np.ndarray


@dataclass(slots=True)
class Ops:
    """CPU operators (aten::*, user ops); `dims` indexes `Trace.shapes` (-1: not recorded)."""

    name: np.ndarray
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    external_id: np.ndarray
    thread: np.ndarray
    dims: np.ndarray


@dataclass(slots=True)
class Ranges:
    """Intervals on a CPU thread: `nn.Module` python_function events or record_function annotations."""

    name: np.ndarray
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    thread: np.ndarray


LAYOUT = {
    "kernels": ("name", "ts_ns", "dur_ns", "correlation", "device", "stream", "kind"),
    "launches": ("name", "ts_ns", "dur_ns", "correlation", "external_id", "thread"),
    "ops": ("name", "ts_ns", "dur_ns", "external_id", "thread", "dims"),
    "modules": ("name", "ts_ns", "dur_ns", "thread"),
    "annotations": ("name", "ts_ns", "dur_ns", "thread"),
}
FLUSH_ROWS = 1 << 16  # rows a table buffers in memory before they go to its file


@dataclass(slots=True)
class Trace:
    """One parsed trace (one rank / process); its tables live on disk (`tables`), read a block at a time.

    `kernels`, `launches`, `ops`, `modules` and `annotations` read a whole table into memory: for small
    traces and tests. Analysis streams the tables instead (attribute.attribute_stream).
    """

    path: str
    names: list[str]
    shapes: list[tuple]
    tables: Tables
    device_properties: list[dict]
    source: str  # "kineto" or "nsys"
    events_read: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def arch(self) -> str | None:
        """The GPU architecture as sm_XY, from deviceProperties (None on CPU-only traces)."""
        for prop in self.device_properties:
            major, minor = prop.get("computeMajor"), prop.get("computeMinor")
            if isinstance(major, int) and isinstance(minor, int):
                return f"sm_{major}{minor}"
        return None

    @property
    def has_kernels(self) -> bool:
        return self.tables["kernels"].rows > 0

    def count(self, table: str) -> int:
        return self.tables[table].rows

    def _columns(self, table: str) -> dict[str, np.ndarray]:
        rows = self.tables[table].read_all()
        return {c: np.ascontiguousarray(rows[c]) for c in LAYOUT[table]}

    @property
    def kernels(self) -> Kernels:
        return Kernels(**self._columns("kernels"))

    @property
    def launches(self) -> Launches:
        return Launches(**self._columns("launches"))

    @property
    def ops(self) -> Ops:
        return Ops(**self._columns("ops"))

    @property
    def modules(self) -> Ranges:
        return Ranges(**self._columns("modules"))

    @property
    def annotations(self) -> Ranges:
        return Ranges(**self._columns("annotations"))


class TraceBuilder:
    """Accumulates events into typed arrays, interning names and threads; full blocks go to disk."""

    def __init__(self, path: str, source: str):
        self.path = path
        self.source = source
        self.names: list[str] = []
        self._name_ids: dict[str, int] = {}
        self.shapes: list[tuple] = []
        self._shape_ids: dict[tuple, int] = {}
        self._raw_shape_ids: dict[bytes, int] = {}
        self._thread_ids: dict[tuple, int] = {}
        self.device_properties: list[dict] = []
        self.events_read = 0
        self.notes: list[str] = []  # what the parser could not read as asked, for the analysis to repeat
        self.tables = Tables(LAYOUT)
        self.k = {c: array("q") for c in LAYOUT["kernels"]}
        self.l = {c: array("q") for c in LAYOUT["launches"]}
        self.o = {c: array("q") for c in LAYOUT["ops"]}
        self.m = {c: array("q") for c in LAYOUT["modules"]}
        self.a = {c: array("q") for c in LAYOUT["annotations"]}

    def name_id(self, name: str) -> int:
        nid = self._name_ids.get(name)
        if nid is None:
            nid = self._name_ids[name] = len(self.names)
            self.names.append(name)
        return nid

    def thread_id(self, pid, tid) -> int:
        key = (pid, tid)
        t = self._thread_ids.get(key)
        if t is None:
            t = self._thread_ids[key] = len(self._thread_ids)
        return t

    def shape_id(self, dims) -> int:
        key = _freeze(dims)
        s = self._shape_ids.get(key)
        if s is None:
            s = self._shape_ids[key] = len(self.shapes)
            self.shapes.append(key)
        return s

    def raw_shape_id(self, raw) -> int:
        """Intern a shape given as raw JSON bytes (msgspec.Raw); decode each distinct one once."""
        key = bytes(raw)
        s = self._raw_shape_ids.get(key)
        if s is None:
            try:
                dims = msgspec.json.decode(key)
            except msgspec.DecodeError:
                dims = None
            s = self._raw_shape_ids[key] = self.shape_id(dims) if isinstance(dims, list) else -1
        return s

    def add_kernel(self, name, ts_ns, dur_ns, correlation, device, stream, kind) -> None:
        k = self.k
        k["name"].append(self.name_id(name))
        k["ts_ns"].append(ts_ns)
        k["dur_ns"].append(dur_ns)
        k["correlation"].append(correlation)
        k["device"].append(device)
        k["stream"].append(stream)
        k["kind"].append(kind)

    def add_launch(self, name, ts_ns, dur_ns, correlation, external_id, thread) -> None:
        ln = self.l
        ln["name"].append(self.name_id(name))
        ln["ts_ns"].append(ts_ns)
        ln["dur_ns"].append(dur_ns)
        ln["correlation"].append(correlation)
        ln["external_id"].append(external_id)
        ln["thread"].append(thread)

    def add_op(self, name, ts_ns, dur_ns, external_id, thread, dims_id) -> None:
        o = self.o
        o["name"].append(self.name_id(name))
        o["ts_ns"].append(ts_ns)
        o["dur_ns"].append(dur_ns)
        o["external_id"].append(external_id)
        o["thread"].append(thread)
        o["dims"].append(dims_id)

    def add_range(self, table: str, name, ts_ns, dur_ns, thread) -> None:
        r = self.m if table == "module" else self.a
        r["name"].append(self.name_id(name))
        r["ts_ns"].append(ts_ns)
        r["dur_ns"].append(dur_ns)
        r["thread"].append(thread)

    def spill(self, rows: int | None = None) -> None:
        """Write every table holding `rows` (default FLUSH_ROWS) rows or more to disk (0: all of them)."""
        rows = FLUSH_ROWS if rows is None else rows
        for table, cols in (("kernels", self.k), ("launches", self.l), ("ops", self.o), ("modules", self.m),
                            ("annotations", self.a)):
            n = len(cols["name"])
            if n and n >= rows:
                block = np.empty(n, dtype=self.tables[table].dtype)
                for c, values in cols.items():
                    block[c] = np.frombuffer(values, dtype=np.int64)
                    del values[:]
                self.tables[table].append(block)

    def build(self) -> Trace:
        self.spill(0)
        return Trace(
            path=self.path,
            names=self.names,
            shapes=self.shapes,
            tables=self.tables,
            device_properties=self.device_properties,
            source=self.source,
            events_read=self.events_read,
            notes=self.notes,
        )


def _freeze(dims) -> tuple:
    """Input Dims as nested tuples (lists of tensors inside stay nested)."""
    if isinstance(dims, list):
        return tuple(_freeze(d) for d in dims)
    return dims
