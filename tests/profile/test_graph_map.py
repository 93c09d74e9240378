"""Steps replayed from CUDA graphs, attributed through the eager trace of the same steps.

The eager traces are real (the embedded engine on an H200, capacity-bound indexer at 262144); their
graph-replay versions are made by tests/profile/graphify.py: one replay op and launch per step, every
kernel without CPU op, shapes or modules, and where asked kernels fused, dropped or reordered.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from graphify import graphify  # noqa: E402

from rooftop.profile import analyze, load_trace  # noqa: E402

DATA = Path(__file__).parent / "data"
EAGER = DATA / "h200_capacity_ctx262144.json.gz"


@pytest.fixture(scope="module")
def eager():
    return load_trace(EAGER), analyze(load_trace(EAGER), context_length=262144)


def shares(summary) -> dict[str, float]:
    return {c.name: c.share for c in summary.components}


def test_without_a_map_the_graph_says_so_and_how_to_get_one(tmp_path, eager):
    s = analyze(load_trace(graphify(EAGER, tmp_path / "g.json")), context_length=262144)
    assert shares(s)["cuda_graph"] > 0.9 and s.capacity_findings == []
    note = next(n for n in s.notes if "ran as CUDA-graph replays" in n)
    assert "--eager-trace" in note and '{"eager": true}' in note and "--enforce-eager" in note


def test_the_eager_map_gives_the_graph_its_modules_shapes_and_capacity_finding(tmp_path, eager):
    eager_trace, truth = eager
    s = analyze(load_trace(graphify(EAGER, tmp_path / "g.json")), context_length=262144, eager_map=eager_trace)
    assert s.attribution_source == f"eager map {EAGER}"
    assert shares(s) == pytest.approx(shares(truth), abs=1e-6)  # the same kernels, the same times
    (f,) = s.capacity_findings
    (t,) = truth.capacity_findings
    assert (f.dim, f.component, f.path) == (t.dim, t.component, t.path) == (262144, "indexer", t.path)
    assert f.ms_per_step == pytest.approx(t.ms_per_step) and set(f.ops) == set(t.ops)
    assert any("CUDA-graph replays: each takes the module, op and shapes of its eager twin" in n for n in s.notes)


@pytest.mark.parametrize("change", [
    {"fuse": (0, 7, 20)},  # a graph may run fused kernels where eager ran two
    {"drop": (3, 11)},  # or leave some out
    {"swap": (5, 15)},  # or order neighbours differently
    {"fuse": (2,), "drop": (9,), "swap": (30,)},
])
def test_fused_missing_and_reordered_kernels_stay_within_a_point(tmp_path, eager, change):
    eager_trace, truth = eager
    s = analyze(load_trace(graphify(EAGER, tmp_path / "g.json", **change)), context_length=262144,
                eager_map=eager_trace)
    expected = shares(truth)
    for name, share in shares(s).items():
        assert share == pytest.approx(expected.get(name, 0.0), abs=0.01), (name, change)
    assert [f.dim for f in s.capacity_findings] == [262144]
    assert s.unattributed_share <= truth.unattributed_share + 0.01
