"""Parser of Nsight Systems SQLite exports (`nsys export --type sqlite`) into a `Trace`.

Kernels, memcpys and memsets come from the CUPTI_ACTIVITY_KIND_* tables, launches from
CUPTI_ACTIVITY_KIND_RUNTIME (joined on correlationId), names from StringIds. NVTX ranges become CPU
ops when they name an aten op (torch's emit_nvtx: "aten::bmm, seq = 3, sizes = [[..]]") and
annotation ranges (module paths, ProfilerStep#N) otherwise. nsys has no External id: launches are
joined to ops by nesting on the launching thread.

CUDA graphs: traced node by node (`nsys profile --cuda-graph-trace=node`), a replay's kernels are in
the kernel table under the graph launch's correlationId. Traced whole (`--cuda-graph-trace=graph`,
the default of many nsys versions), a replay is one row of CUPTI_ACTIVITY_KIND_GRAPH_TRACE and its
kernels are nowhere: each row becomes one device event, "CUDA graph <id> (nodes not traced)", so the
replay's time counts, and a note says what cannot be seen and how to capture it.
"""

import json
import re
import sqlite3
from pathlib import Path

from rooftop.errors import RooftopError
from rooftop.profile.trace import KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, Trace, TraceBuilder

_SIZES = re.compile(r"sizes = (\[.*?\]\])")
_BATCH_ROWS = 100_000


def load_nsys(path: str | Path) -> Trace:
    """Parse an Nsight Systems SQLite export."""
    path = Path(path)
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        raise RooftopError(f"{path} is not a readable SQLite file ({exc})", "export it with `nsys export --type sqlite`") from None
    try:
        if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables or "StringIds" not in tables:
            raise RooftopError(
                f"{path} has no CUPTI_ACTIVITY_KIND_KERNEL/StringIds tables",
                "capture with `nsys profile -t cuda,nvtx` and export with `nsys export --type sqlite`",
            )
        return _read(db, tables, path)
    except sqlite3.DatabaseError as exc:
        raise RooftopError(f"{path} is not a complete nsys export ({exc})", "export it again") from None
    finally:
        db.close()


def _read(db: sqlite3.Connection, tables: set[str], path: Path) -> Trace:
    b = TraceBuilder(str(path), "nsys")
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    kernel_cols = {r[1] for r in db.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")}
    name_col = "demangledName" if "demangledName" in kernel_cols else "shortName"
    _rows(b, db, f"SELECT {name_col}, start, end, correlationId, deviceId, streamId FROM CUPTI_ACTIVITY_KIND_KERNEL",
          lambda r: b.add_kernel(strings.get(r[0], str(r[0])), r[1], r[2] - r[1], r[3], r[4], r[5], KIND_KERNEL))
    for table, kind, label in (("CUPTI_ACTIVITY_KIND_MEMCPY", KIND_MEMCPY, "Memcpy"),
                               ("CUPTI_ACTIVITY_KIND_MEMSET", KIND_MEMSET, "Memset")):
        if table in tables:
            _rows(b, db, f"SELECT start, end, correlationId, deviceId, streamId FROM {table}",
                  lambda r, kind=kind, label=label: b.add_kernel(label, r[0], r[1] - r[0], r[2], r[3], r[4], kind))
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        _rows(b, db, "SELECT nameId, start, end, correlationId, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME",
              lambda r: b.add_launch(strings.get(r[0], str(r[0])), r[1], r[2] - r[1], r[3], -1, b.thread_id(0, r[4])))
    if "NVTX_EVENTS" in tables:
        # Ranges only (push/pop 59, start/end 60); marks have no end.
        _rows(b, db, "SELECT text, textId, start, end, globalTid FROM NVTX_EVENTS "
                     "WHERE end IS NOT NULL AND eventType IN (59, 60)",
              lambda r: _nvtx(b, strings, r))
    if "CUPTI_ACTIVITY_KIND_GRAPH_TRACE" in tables:
        _graph_replays(b, db)
    if "TARGET_INFO_GPU" in tables:
        cols = {r[1] for r in db.execute("PRAGMA table_info(TARGET_INFO_GPU)")}
        if {"computeMajor", "computeMinor"} <= cols:
            for major, minor, sms in db.execute(
                f"SELECT computeMajor, computeMinor, {'smCount' if 'smCount' in cols else 'NULL'} FROM TARGET_INFO_GPU"
            ):
                b.device_properties.append({"computeMajor": major, "computeMinor": minor, "numSms": sms})
    return b.build()


GRAPH_EVENT = "CUDA graph {} (nodes not traced)"


def _graph_replays(b: TraceBuilder, db: sqlite3.Connection) -> None:
    """Whole-graph replay rows (`--cuda-graph-trace=graph`) as one device event each, with a note."""
    cols = {r[1] for r in db.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_GRAPH_TRACE)")}
    graph = "graphId" if "graphId" in cols else "graphExecId" if "graphExecId" in cols else "NULL"
    device = "deviceId" if "deviceId" in cols else "0"
    stream = "streamId" if "streamId" in cols else "0"
    count, total_ns = [0], [0]

    def add(r) -> None:
        start, end, corr, dev, strm, gid = r
        b.add_kernel(GRAPH_EVENT.format("?" if gid is None else gid), start, end - start, corr, dev, strm, KIND_KERNEL)
        count[0] += 1
        total_ns[0] += end - start

    _rows(b, db, f"SELECT start, end, correlationId, {device}, {stream}, {graph} FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE",
          add)
    if count[0]:
        b.notes.append(
            f"{count[0]} CUDA graph replays ({total_ns[0] / 1e6:.3f} ms) were traced whole (nsys "
            "--cuda-graph-trace=graph): their kernels are not in the export, so each replay counts as one "
            "event, 'CUDA graph <id> (nodes not traced)', and no kernel or module inside it can be named; "
            "capture with `nsys profile --cuda-graph-trace=node` to attribute them"
        )


def _rows(b: TraceBuilder, db: sqlite3.Connection, sql: str, add) -> None:
    cur = db.execute(sql)
    while rows := cur.fetchmany(_BATCH_ROWS):
        b.events_read += len(rows)
        for r in rows:
            add(r)
        b.spill()


def _nvtx(b: TraceBuilder, strings: dict, row) -> None:
    text, text_id, start, end, tid = row
    name = text if text is not None else strings.get(text_id, "")
    thread = b.thread_id(0, tid)
    if name.startswith("aten::") or ", seq = " in name:
        op = name.split(",", 1)[0]
        dims = -1
        sizes = _SIZES.search(name)
        if sizes:
            try:
                dims = b.shape_id(json.loads(sizes.group(1)))
            except ValueError:
                dims = -1
        b.add_op(op, start, end - start, -1, thread, dims)
    elif name:
        b.add_range("annotation", name, start, end - start, thread)
