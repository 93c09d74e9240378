"""nsys is not installed here: build a small SQLite export with the tables and columns nsys writes."""

import sqlite3

import pytest

from rooftop.errors import RooftopError
from rooftop.profile import analyze, load_trace

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
