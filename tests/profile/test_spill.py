"""Traces streamed from disk: memory that does not grow with the trace, and the same answer whatever the
block size or the order of the events in the file."""

import gzip
import json
import random
import sys
import tracemalloc
from pathlib import Path

import pytest

import rooftop.profile.attribute as attribute
import rooftop.profile.kineto as kineto
import rooftop.profile.spill as spill
import rooftop.profile.trace as trace_module
from rooftop.profile import analyze, load_trace

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from grow_trace import grow  # noqa: E402

H200 = Path(__file__).parent / "data" / "h200_capacity_ctx262144.json.gz"
CONTEXT = 262144


def _small_blocks(monkeypatch, rows: int) -> None:
    """Blocks of `rows` rows, 1 MiB chunks and a 50 ms launch window: a small trace spans many blocks."""
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 1 << 20)
    monkeypatch.setattr(trace_module, "FLUSH_ROWS", rows)
    monkeypatch.setattr(attribute, "HORIZON_NS", 50_000_000)
    monkeypatch.setattr(spill, "ROWS_PER_BLOCK", rows)


def _peak_bytes(path: Path) -> int:
    """Peak of Python and numpy allocations while the trace is parsed and analysed."""
    tracemalloc.start()
    try:
        analyze(load_trace(path), context_length=CONTEXT)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def grown(tmp_path_factory) -> dict[int, Path]:
    """The real H200 trace (7 steps, 64k events), and itself three times over (Kineto's file layout)."""
    d = tmp_path_factory.mktemp("grown")
    return {n: d / f"x{n}.json" for n in (1, 3) if grow(H200, d / f"x{n}.json", copies=n)}


def test_memory_does_not_grow_with_the_trace(grown, monkeypatch):
    # In the file a step's kernels come a whole section after its ops; holding the trace's columns
    # (or a sweep over all of them) would take three times the memory for three times the trace.
    _small_blocks(monkeypatch, 4096)
    one, three = _peak_bytes(grown[1]), _peak_bytes(grown[3])
    assert three < 1.2 * one, f"peak {one / 2**20:.1f} MiB for one copy, {three / 2**20:.1f} MiB for three"


def test_small_blocks_give_the_same_summary(grown, monkeypatch):
    whole = analyze(load_trace(grown[3]), context_length=CONTEXT).to_json_dict()
    _small_blocks(monkeypatch, 1000)
    assert analyze(load_trace(grown[3]), context_length=CONTEXT).to_json_dict() == whole


def test_events_out_of_time_order_give_the_same_summary(tmp_path, monkeypatch):
    # Another writer's order: the events shuffled, so every block written is its own sorted run.
    top = json.loads(gzip.decompress(H200.read_bytes()))
    events = top["traceEvents"]
    random.Random(0).shuffle(events)
    (tmp_path / "shuffled.json").write_text(json.dumps(top))
    whole = analyze(load_trace(H200), context_length=CONTEXT).to_json_dict()
    _small_blocks(monkeypatch, 1000)
    shuffled = load_trace(tmp_path / "shuffled.json")
    assert len(shuffled.tables["ops"].runs) > 5
    got = analyze(shuffled, context_length=CONTEXT).to_json_dict()
    assert got.pop("trace") != whole.pop("trace")  # the same summary, of another file
    assert got == whole
