"""nsys is not installed here: build a small SQLite export with the tables and columns nsys writes."""

import sqlite3

import pytest

from rooftop.errors import RooftopError
from rooftop.profile import analyze, hides_modules, load_trace
from rooftop.profile.classify import classify_kernel

SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
  shortName INTEGER NOT NULL, gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER, blockZ INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER,
  globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER, callchainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, bytes INTEGER, copyKind INTEGER);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
  category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER, domainId INTEGER);
CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT, computeMajor INTEGER, computeMinor INTEGER, smCount INTEGER);
"""
TID = 281474976710656 + 1234


def make_export(path):
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    strings = ["cudaLaunchKernel", "void at::native::vectorized_elementwise_kernel<4, MulFunctor>", "mul",
               "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", "nvjet", "cudaMemcpyAsync"]
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(strings)))
    db.execute("INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA H200', 9, 0, 132)")
    nvtx = []
    kernels, runtime = [], []
    for step in range(2):
        o = step * 1_000_000
        nvtx.append((o, o + 900_000, 59, None, None, None, f"ProfilerStep#{step}", TID, None, None, 0))
        nvtx.append((o + 10_000, o + 500_000, 59, None, None, None, "model.layers.0.attn.indexer", TID, None, None, 0))
        nvtx.append((o + 20_000, o + 40_000, 59, None, None, None,
                     "aten::mul, seq = 3, op_id = 7, sizes = [[32, 262208, 64], [32, 1, 64]], input_op_ids = []",
                     TID, None, None, 0))
        runtime.append((o + 25_000, o + 30_000, 1, TID, 10 + step, 0, 0, 0))
        kernels.append((o + 100_000, o + 400_000, 0, 1, 7, 10 + step, 1, 1, 2, 1, 1, 1, 128, 1, 1))
        nvtx.append((o + 600_000, o + 700_000, 59, None, None, None, "model.layers.0.mlp", TID, None, None, 0))
        nvtx.append((o + 610_000, o + 620_000, 59, None, None, None, "aten::mm, seq = 4, op_id = 8, sizes = [[32, 4096], "
                     "[4096, 2048]], input_op_ids = []", TID, None, None, 0))
        runtime.append((o + 612_000, o + 615_000, 1, TID, 20 + step, 0, 0, 0))
        kernels.append((o + 620_000, o + 720_000, 0, 1, 7, 20 + step, 1, 3, 4, 1, 1, 1, 128, 1, 1))
        runtime.append((o + 800_000, o + 805_000, 1, TID, 30 + step, 5, 0, 0))
    db.executemany("INSERT INTO NVTX_EVENTS VALUES (?,?,?,?,?,?,?,?,?,?,?)", nvtx)
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", kernels)
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?,?)", runtime)
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?,?,?,?,?,?,?,?,?)",
                   [(s * 1_000_000 + 850_000, s * 1_000_000 + 860_000, 0, 1, 7, 30 + s, 1, 4096, 1) for s in range(2)])
    db.commit()
    db.close()
    return path


def test_nsys_export_is_attributed(tmp_path):
    t = load_trace(make_export(tmp_path / "report.sqlite"))
    assert t.source == "nsys" and t.arch == "sm_90"
    assert len(t.kernels.name) == 6 and len(t.ops.name) == 4 and len(t.launches.name) == 6
    s = analyze(t, context_length=262144)
    assert s.steps == 2 and s.basis == "kernels" and s.granularity == "module"
    comps = {c.name: c for c in s.components}
    assert comps["indexer"].ms_per_step == pytest.approx(0.3) and comps["indexer"].path == "model.layers.*.attn.indexer"
    assert comps["mlp"].ms_per_step == pytest.approx(0.1)
    assert s.tensor_core_share == pytest.approx(0.1 / 0.41)
    assert s.categories["memcpy/memset"] == pytest.approx(0.01 / 0.41)
    f = s.capacity_findings[0]
    assert (f.dim, f.ops, f.component) == (262208, ["aten::mul"], "indexer")


def test_not_an_nsys_export(tmp_path):
    db = sqlite3.connect(tmp_path / "other.sqlite")
    db.execute("CREATE TABLE t (a)")
    db.commit()
    db.close()
    with pytest.raises(RooftopError, match="CUPTI_ACTIVITY_KIND_KERNEL"):
        load_trace(tmp_path / "other.sqlite")
    (tmp_path / "bad.sqlite").write_bytes(b"SQLite format 3\x00" + b"\x00" * 50)
    with pytest.raises(RooftopError):
        load_trace(tmp_path / "bad.sqlite")


def make_graph_export(path, node_level: bool):
    """Three decode steps, each one replay of a CUDA graph launched by cudaGraphLaunch_v10000 (nsys's
    versioned name), traced node by node (two kernels a replay) or whole (one GRAPH_TRACE row)."""
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start INTEGER NOT NULL, end INTEGER NOT NULL, "
               "deviceId INTEGER NOT NULL, contextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, "
               "globalPid INTEGER, graphId INTEGER, graphExecId INTEGER)")
    strings = ["cudaGraphLaunch_v10000", "_sparse_mla_split_kernel", "_gate_up_kernel", "decode_step"]
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(strings)))
    db.execute("INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA H200', 9, 0, 132)")
    for step in range(3):
        o = step * 1_000_000
        db.execute("INSERT INTO NVTX_EVENTS VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                   (o, o + 50_000, 59, None, None, None, "decode_step", TID, None, None, 0))
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?,?)",
                   (o + 10_000, o + 20_000, 1, TID, 100 + step, 0, 0, 0))
        if node_level:
            db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", [
                (o + 30_000, o + 330_000, 0, 1, 7, 100 + step, 1, 1, 1, 64, 1, 1, 128, 1, 1),
                (o + 340_000, o + 540_000, 0, 1, 7, 100 + step, 1, 2, 2, 64, 1, 1, 128, 1, 1),
            ])
        else:
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE VALUES (?,?,?,?,?,?,?,?,?)",
                       (o + 30_000, o + 540_000, 0, 1, 7, 100 + step, 1, 5, 9))
    db.commit()
    db.close()
    return path


def test_nsys_graph_replays_traced_node_by_node(tmp_path):
    t = load_trace(make_graph_export(tmp_path / "nodes.sqlite", node_level=True))
    assert hides_modules(t) == "CUDA graphs"  # from the versioned launch name
    s = analyze(t)
    assert s.steps == 3 and s.gpu_busy_ms_per_step == pytest.approx(0.5)
    assert not any("nodes not traced" in n for n in s.notes)


def test_nsys_graph_replays_traced_whole_count_and_say_so(tmp_path):
    t = load_trace(make_graph_export(tmp_path / "whole.sqlite", node_level=False))
    assert hides_modules(t) == "CUDA graphs"
    assert list(t.kernels.dur_ns) == [510_000] * 3
    s = analyze(t)
    # the replays' time counts (0.51 ms a step), under one event each that says what it is
    assert s.steps == 3 and s.gpu_busy_ms_per_step == pytest.approx(0.51)
    assert s.categories["other"] == pytest.approx(1.0)
    assert classify_kernel("CUDA graph 5 (nodes not traced)", "sm_90").rule == "cuda graph (nodes not traced)"
    note = next(n for n in s.notes if "traced whole" in n)
    assert note.startswith("3 CUDA graph replays (1.530 ms)") and "--cuda-graph-trace=node" in note
