"""The campaign store: one SQLite file per run directory; every write is committed as it happens.

Everything a report needs is here, so `rooftop report RUN_DIR` rebuilds the documents from this
file alone, and `--resume` reads which units of work are done from the `units` table.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rooftop.errors import RooftopError

STORE_NAME = "store.sqlite"

UNIT_RUNNING = "running"
UNIT_DONE = "done"
UNIT_FAILED = "failed"
UNIT_INTERRUPTED = "interrupted"  # was running when its rooftop was killed; redone on resume if needed

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    name TEXT NOT NULL,
    goal TEXT NOT NULL,
    mode TEXT NOT NULL,
    spec_toml TEXT NOT NULL,
    spec_path TEXT,
    created_utc TEXT NOT NULL,
    host_json TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS deployments (
    variant TEXT NOT NULL,
    repeat INTEGER NOT NULL,
    levers_json TEXT NOT NULL,
    spec_json TEXT NOT NULL,
    inventory_json TEXT NOT NULL DEFAULT '{}',
    launch_script TEXT NOT NULL DEFAULT '',
    placement_json TEXT NOT NULL DEFAULT '[]',
    url TEXT,
    deployed_utc TEXT NOT NULL,
    PRIMARY KEY (variant, repeat)
);
CREATE TABLE IF NOT EXISTS bench_levels (
    series TEXT NOT NULL,
    variant TEXT NOT NULL,
    repeat INTEGER NOT NULL,
    concurrency INTEGER NOT NULL,
    summary_json TEXT NOT NULL,
    valid INTEGER NOT NULL,
    measured_utc TEXT NOT NULL,
    PRIMARY KEY (series, variant, repeat, concurrency)
);
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    series TEXT NOT NULL,
    variant TEXT NOT NULL,
    repeat INTEGER NOT NULL,
    concurrency INTEGER NOT NULL,
    idx INTEGER,
    status TEXT,
    error_class TEXT,
    decided_ns INTEGER,
    end_ns INTEGER,
    record_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS requests_by_level ON requests (series, variant, repeat, concurrency);
CREATE TABLE IF NOT EXISTS traces (
    variant TEXT NOT NULL,
    path TEXT NOT NULL,
    concurrency INTEGER,
    analysis_json TEXT NOT NULL,
    captured_utc TEXT NOT NULL,
    PRIMARY KEY (variant, path)
);
CREATE TABLE IF NOT EXISTS analyses (
    variant TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload_json TEXT NOT NULL,
    PRIMARY KEY (variant, kind)
);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    subject TEXT NOT NULL,
    payload_json TEXT NOT NULL,
    decided_utc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS units (
    key TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    started_utc TEXT,
    finished_utc TEXT,
    error TEXT
);
"""


def utc_now() -> str:
    """Current UTC time as ISO 8601 with seconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(slots=True)
class RunRow:
    """The campaign a run directory holds."""

    name: str
    goal: str
    mode: str
    spec_toml: str
    spec_path: str | None
    created_utc: str
    host: dict


@dataclass(slots=True)
class LevelRow:
    """One concurrency level of one repeat of one variant, as the load generator summarised it."""

    series: str
    variant: str
    repeat: int
    concurrency: int
    summary: dict
    valid: bool


@dataclass(slots=True)
class DeploymentRow:
    """One bring-up of a variant: its resolved spec, inventory, launch script and verified placement."""

    variant: str
    repeat: int
    levers: list[str]
    spec: dict
    inventory: dict
    launch_script: str
    placement: list
    url: str | None


@dataclass(slots=True)
class TraceRow:
    """A captured profile trace and its attribution (the profile package's JSON)."""

    variant: str
    path: str
    concurrency: int | None
    analysis: dict


@dataclass(slots=True)
class DecisionRow:
    """A decision the campaign took: a lever's verdict, a lever joining the baseline."""

    kind: str
    subject: str
    payload: dict
    decided_utc: str


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


class Store:
    """A run directory's SQLite store (WAL; autocommit, so nothing collected is lost)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        # isolation_level=None: autocommit, every statement is durable when it returns.
        self.db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)

    @classmethod
    def open(cls, run_dir: Path | str) -> Store:
        """Open the store of an existing run directory; a clear error if there is none."""
        path = Path(run_dir) / STORE_NAME
        if not path.is_file():
            raise RooftopError(
                f"{run_dir}: no {STORE_NAME} in this directory",
                "pass a run directory written by `rooftop run` (runs/<name>-<time>/)",
            )
        return cls(path)

    @classmethod
    def create(cls, run_dir: Path | str) -> Store:
        """Create the run directory and its store."""
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        return cls(Path(run_dir) / STORE_NAME)

    @property
    def run_dir(self) -> Path:
        return self.path.parent

    def close(self) -> None:
        self.db.close()

    # ---- runs
    def put_run(self, name: str, goal: str, mode: str, spec_toml: str, spec_path: str | None = None,
                host: dict | None = None) -> None:
        """Record the campaign once; a resumed run keeps its first record."""
        self.db.execute(
            "INSERT OR IGNORE INTO runs (id, name, goal, mode, spec_toml, spec_path, created_utc, host_json)"
            " VALUES (1, ?, ?, ?, ?, ?, ?, ?)",
            (name, goal, mode, spec_toml, spec_path, utc_now(), _json(host or {})),
        )

    def run(self) -> RunRow:
        row = self.db.execute(
            "SELECT name, goal, mode, spec_toml, spec_path, created_utc, host_json FROM runs WHERE id = 1"
        ).fetchone()
        if row is None:
            raise RooftopError(f"{self.path}: the store has no campaign record", "start it with `rooftop run`")
        return RunRow(*row[:6], json.loads(row[6]))

    # ---- deployments
    def put_deployment(self, variant: str, repeat: int, levers: list[str], spec: dict, inventory: dict,
                       launch_script: str, placement: list, url: str | None = None) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO deployments VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (variant, repeat, _json(levers), _json(spec), _json(inventory), launch_script,
             _json(placement), url, utc_now()),
        )

    def deployments(self) -> list[DeploymentRow]:
        rows = self.db.execute(
            "SELECT variant, repeat, levers_json, spec_json, inventory_json, launch_script, placement_json, url"
            " FROM deployments ORDER BY deployed_utc, variant, repeat"
        ).fetchall()
        return [DeploymentRow(v, r, json.loads(lv), json.loads(s), json.loads(i), ls, json.loads(p), u)
                for v, r, lv, s, i, ls, p, u in rows]

    # ---- bench
    def put_level(self, series: str, variant: str, repeat: int, concurrency: int, summary: dict,
                  valid: bool) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO bench_levels VALUES (?, ?, ?, ?, ?, ?, ?)",
            (series, variant, repeat, concurrency, _json(summary), int(valid), utc_now()),
        )

    def levels(self, variant: str | None = None, series: str | None = None) -> list[LevelRow]:
        sql = "SELECT series, variant, repeat, concurrency, summary_json, valid FROM bench_levels WHERE 1=1"
        args: list = []
        if variant is not None:
            sql, args = sql + " AND variant = ?", args + [variant]
        if series is not None:
            sql, args = sql + " AND series = ?", args + [series]
        rows = self.db.execute(sql + " ORDER BY series, variant, concurrency, repeat", args).fetchall()
        return [LevelRow(s, v, r, c, json.loads(j), bool(ok)) for s, v, r, c, j, ok in rows]

    def put_requests(self, series: str, variant: str, repeat: int, concurrency: int,
                     records: list[dict]) -> None:
        """Store per-request records (dicts with perf_counter_ns integer times) in one transaction."""
        rows = [(series, variant, repeat, concurrency, rec.get("index"), rec.get("status"),
                 rec.get("error_class"), rec.get("decided_ns"), rec.get("end_ns"), _json(rec))
                for rec in records]
        with self.db:  # one transaction: a level's records land together or not at all
            self.db.execute("BEGIN")
            self.db.execute(
                "DELETE FROM requests WHERE series = ? AND variant = ? AND repeat = ? AND concurrency = ?",
                (series, variant, repeat, concurrency),
            )
            self.db.executemany(
                "INSERT INTO requests (series, variant, repeat, concurrency, idx, status, error_class,"
                " decided_ns, end_ns, record_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    def requests(self, variant: str, repeat: int | None = None, concurrency: int | None = None) -> list[dict]:
        sql, args = "SELECT record_json FROM requests WHERE variant = ?", [variant]
        if repeat is not None:
            sql, args = sql + " AND repeat = ?", args + [repeat]
        if concurrency is not None:
            sql, args = sql + " AND concurrency = ?", args + [concurrency]
        return [json.loads(r[0]) for r in self.db.execute(sql + " ORDER BY id", args)]

    def request_counts(self) -> dict[tuple[str, str], int]:
        """Requests stored per (variant, status)."""
        rows = self.db.execute("SELECT variant, status, COUNT(*) FROM requests GROUP BY variant, status")
        return {(v, s): n for v, s, n in rows}

    # ---- profiles and other analyses
    def put_trace(self, variant: str, path: str, analysis: dict, concurrency: int | None = None) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO traces VALUES (?, ?, ?, ?, ?)",
            (variant, path, concurrency, _json(analysis), utc_now()),
        )

    def traces(self, variant: str | None = None) -> list[TraceRow]:
        sql, args = "SELECT variant, path, concurrency, analysis_json FROM traces", []
        if variant is not None:
            sql, args = sql + " WHERE variant = ?", [variant]
        return [TraceRow(v, p, c, json.loads(a))
                for v, p, c, a in self.db.execute(sql + " ORDER BY captured_utc", args)]

    def put_analysis(self, variant: str, kind: str, payload: dict) -> None:
        """Store a per-variant analysis (kind: 'roofline', 'quality', 'quality_reference', ...)."""
        self.db.execute("INSERT OR REPLACE INTO analyses VALUES (?, ?, ?)", (variant, kind, _json(payload)))

    def analysis(self, variant: str, kind: str) -> dict | None:
        row = self.db.execute(
            "SELECT payload_json FROM analyses WHERE variant = ? AND kind = ?", (variant, kind)
        ).fetchone()
        return json.loads(row[0]) if row else None

    def analyses(self, kind: str) -> dict[str, dict]:
        rows = self.db.execute("SELECT variant, payload_json FROM analyses WHERE kind = ?", (kind,))
        return {v: json.loads(p) for v, p in rows}

    # ---- decisions
    def put_decision(self, kind: str, subject: str, payload: dict) -> None:
        self.db.execute(
            "INSERT INTO decisions (kind, subject, payload_json, decided_utc) VALUES (?, ?, ?, ?)",
            (kind, subject, _json(payload), utc_now()),
        )

    def decisions(self, kind: str | None = None) -> list[DecisionRow]:
        sql, args = "SELECT kind, subject, payload_json, decided_utc FROM decisions", []
        if kind is not None:
            sql, args = sql + " WHERE kind = ?", [kind]
        return [DecisionRow(k, s, json.loads(p), t) for k, s, p, t in self.db.execute(sql + " ORDER BY id", args)]

    # ---- units of work
    def unit_status(self, key: str) -> str | None:
        row = self.db.execute("SELECT status FROM units WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def start_unit(self, key: str) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO units (key, status, started_utc) VALUES (?, ?, ?)",
            (key, UNIT_RUNNING, utc_now()),
        )

    def finish_unit(self, key: str, error: str | None = None) -> None:
        self.db.execute(
            "UPDATE units SET status = ?, finished_utc = ?, error = ? WHERE key = ?",
            (UNIT_FAILED if error else UNIT_DONE, utc_now(), error, key),
        )

    def mark_interrupted(self) -> int:
        """Units a killed run left 'running' become 'interrupted'; returns how many."""
        cur = self.db.execute("UPDATE units SET status = ?, finished_utc = ? WHERE status = ?",
                              (UNIT_INTERRUPTED, utc_now(), UNIT_RUNNING))
        return cur.rowcount

    def units(self) -> dict[str, str]:
        """Status of every unit started so far, by key."""
        return dict(self.db.execute("SELECT key, status FROM units"))

    def unit_errors(self) -> dict[str, str]:
        return dict(self.db.execute("SELECT key, error FROM units WHERE status = ?", (UNIT_FAILED,)))
