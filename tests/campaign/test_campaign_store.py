"""The store: a real SQLite file in WAL mode, readable by a second connection while written."""

import sqlite3

import pytest

from rooftop.campaign.store import STORE_NAME, Store
from rooftop.errors import RooftopError


def test_every_write_is_visible_to_another_connection_at_once(tmp_path):
    st = Store.create(tmp_path / "run")
    st.put_run("c", "goal", "independent", "[campaign]\nname='c'\n", "c.toml", {"cpus": 2})
    st.put_level("main", "baseline", 0, 4, {"output_tok_s": {"mean": 12.5}}, True)
    st.put_requests("main", "baseline", 0, 4, [{"index": i, "status": "ok", "decided_ns": 10 * i,
                                                 "end_ns": 10 * i + 7} for i in range(5)])
    st.start_unit("main/baseline/r0/sweep")
    # A reader opened now (as `rooftop report` would be during a run) sees everything committed.
    other = sqlite3.connect(tmp_path / "run" / STORE_NAME)
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert other.execute("SELECT COUNT(*) FROM requests").fetchone()[0] == 5
    assert other.execute("SELECT status FROM units").fetchone()[0] == "running"
    assert other.execute("SELECT end_ns FROM requests WHERE idx = 3").fetchone()[0] == 37
    other.close()
    st.close()


def test_round_trip_and_resume_state(tmp_path):
    st = Store.create(tmp_path)
    st.put_run("c", "g", "cumulative", "toml", None)
    st.put_run("other", "g2", "independent", "toml2", None)  # a resumed run keeps its first record
    assert st.run().name == "c" and st.run().mode == "cumulative"
    st.put_level("main", "baseline", 1, 8, {"output_tok_s": {"mean": 3.0}}, False)
    st.put_level("main", "baseline", 1, 8, {"output_tok_s": {"mean": 4.0}}, True)  # replaced, not doubled
    rows = st.levels("baseline")
    assert len(rows) == 1 and rows[0].summary["output_tok_s"]["mean"] == 4.0 and rows[0].valid
    st.put_requests("main", "baseline", 1, 8, [{"index": 0, "status": "error", "error_class": "timeout"}])
    st.put_requests("main", "baseline", 1, 8, [{"index": 0, "status": "ok"}, {"index": 1, "status": "ok"}])
    assert st.request_counts() == {("baseline", "ok"): 2}
    st.start_unit("a")
    st.finish_unit("a")
    st.start_unit("b")
    st.finish_unit("b", error="server died")
    st.start_unit("c")
    assert st.units() == {"a": "done", "b": "failed", "c": "running"}
    assert st.unit_errors() == {"b": "server died"}
    st.put_trace("baseline", "t.json.gz", {"steps": 3}, 4)
    st.put_analysis("baseline", "roofline", {"floor_ms": 1.5})
    st.put_decision("joined_baseline", "context-cap", {"ratio": 5.0})
    st.close()
    again = Store.open(tmp_path)
    assert again.traces()[0].analysis == {"steps": 3} and again.traces()[0].concurrency == 4
    assert again.analysis("baseline", "roofline") == {"floor_ms": 1.5}
    assert again.analysis("baseline", "quality") is None
    assert [d.subject for d in again.decisions("joined_baseline")] == ["context-cap"]
    again.close()


def test_open_without_store_is_a_clear_error(tmp_path):
    with pytest.raises(RooftopError, match="no store.sqlite"):
        Store.open(tmp_path)
