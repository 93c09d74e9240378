"""A trace's tables on disk: rows appended in blocks while parsing, read back in time order a block at a time.

Parsing a 10 GB trace keeps tens of millions of rows; holding them would make memory grow with the
trace. Each table (kernels, launches, ops, ...) is one file of int64 records. A block is sorted by
`ts_ns` before it is written; consecutive blocks in time order form one run (Kineto writes each
category in time order, so a table is usually one run). Readers merge the runs by time: whatever
the file's order, a reader holds at most a block per run.
"""

import shutil
import tempfile
import weakref
from pathlib import Path

import numpy as np

END_NS = 1 << 62  # a time after every event
ROWS_PER_BLOCK = 1 << 16  # rows a reader takes at a time from each run (64 Ki rows: ~4 MiB a table)


class Table:
    """One table's rows on disk: int64 columns, sorted runs of rows."""

    def __init__(self, path: Path, cols: tuple[str, ...]):
        self.path = path
        self.cols = cols
        self.dtype = np.dtype([(c, np.int64) for c in cols])
        self.rows = 0
        self.runs: list[list[int]] = []  # [first row, rows], each sorted by ts_ns
        self.name_ids: set[int] = set()
        self.min_ts_ns = END_NS
        self.max_end_ns = -END_NS
        self._last_ts_ns = -END_NS

    def append(self, block: np.ndarray) -> None:
        """Write a block of records (sorted by ts_ns here; stable, so equal times keep their order)."""
        if not len(block):
            return
        block = block[np.argsort(block["ts_ns"], kind="stable")]
        with open(self.path, "ab") as f:
            block.tofile(f)
        ts = block["ts_ns"]
        if self.runs and ts[0] >= self._last_ts_ns:
            self.runs[-1][1] += len(block)
        else:
            self.runs.append([self.rows, len(block)])
        self.rows += len(block)
        self._last_ts_ns = int(ts[-1])
        self.min_ts_ns = min(self.min_ts_ns, int(ts[0]))
        if "dur_ns" in block.dtype.names:
            self.max_end_ns = max(self.max_end_ns, int((ts + block["dur_ns"]).max()))
        self.name_ids.update(np.unique(block["name"]).tolist())

    def read_all(self) -> np.ndarray:
        """Every row, in file order (whole: for small traces and tests, not for streaming analysis)."""
        if not self.rows:
            return np.zeros(0, dtype=self.dtype)
        return np.fromfile(self.path, dtype=self.dtype)

    def reader(self) -> "TableReader":
        return TableReader(self, ROWS_PER_BLOCK)


class Tables:
    """The tables of one trace, in a temporary directory removed with this object."""

    def __init__(self, layout: dict[str, tuple[str, ...]]):
        self.dir = Path(tempfile.mkdtemp(prefix="rooftop-trace-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.dir, True)
        self.tables = {name: Table(self.dir / f"{name}.bin", cols) for name, cols in layout.items()}

    def __getitem__(self, name: str) -> Table:
        return self.tables[name]


class _Run:
    """A cursor over one sorted run, with the rows read ahead of it."""

    def __init__(self, table: Table, first: int, rows: int):
        self.table, self.next_row, self.end_row = table, first, first + rows
        self.buf = np.zeros(0, dtype=table.dtype)
        self.buf_first = first  # row number of buf[0]

    def fill(self, n: int) -> None:
        """Read ahead until `n` rows are buffered or the run is exhausted."""
        if len(self.buf) >= n or self.next_row >= self.end_row:
            return
        count = min(max(n - len(self.buf), 1), self.end_row - self.next_row)
        more = np.fromfile(self.table.path, dtype=self.table.dtype, count=count,
                           offset=self.next_row * self.table.dtype.itemsize)
        self.buf = np.concatenate([self.buf, more]) if len(self.buf) else more
        self.next_row += count

    @property
    def done(self) -> bool:
        return not len(self.buf) and self.next_row >= self.end_row


class TableReader:
    """Reads a table in time order: `take_before(t)` gives every row with ts_ns < t not yet taken."""

    def __init__(self, table: Table, rows_per_block: int):
        self.n = rows_per_block
        self.runs = [_Run(table, first, rows) for first, rows in table.runs]
        self.dtype = table.dtype

    @property
    def done(self) -> bool:
        return all(r.done for r in self.runs)

    def horizon(self) -> int:
        """A time before which about one block of rows lies (END_NS when fewer rows remain)."""
        t = END_NS
        for r in self.runs:
            r.fill(self.n)
            if len(r.buf) >= self.n:
                t = min(t, int(r.buf["ts_ns"][self.n - 1]))
        return t

    def first_ts(self) -> int:
        t = END_NS
        for r in self.runs:
            r.fill(1)
            if len(r.buf):
                t = min(t, int(r.buf["ts_ns"][0]))
        return t

    def take_before(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows with ts_ns < t, their row numbers in the table), in time order within each run."""
        rows, index = [], []
        for r in self.runs:
            while r.next_row < r.end_row and (not len(r.buf) or r.buf["ts_ns"][-1] < t):
                r.fill(len(r.buf) + self.n)
            k = int(np.searchsorted(r.buf["ts_ns"], t, side="left"))
            if k:
                rows.append(r.buf[:k])
                index.append(np.arange(r.buf_first, r.buf_first + k, dtype=np.int64))
                r.buf, r.buf_first = r.buf[k:], r.buf_first + k
        if not rows:
            return np.zeros(0, dtype=self.dtype), np.zeros(0, dtype=np.int64)
        if len(rows) == 1:
            return rows[0], index[0]
        return np.concatenate(rows), np.concatenate(index)


def time_blocks(readers: list[TableReader]):
    """Yield (t, [(rows, row numbers) per reader]): all rows with ts_ns < t, for increasing t, until all are read.

    Each block holds about one block of rows of the densest table; equal times never straddle two blocks.
    """
    while not all(r.done for r in readers):
        t = min(r.horizon() for r in readers)
        first = min(r.first_ts() for r in readers)
        if t <= first:  # a block of rows all at one time: take that time whole
            t = first + 1
        yield t, [r.take_before(t) for r in readers]
