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
    note = next(n for n in s.notes if "CUDA-graph replays" in n)
    assert "those matched op for op (100% of the step's time) take their eager twin's module, op and shapes" in note
    assert "(0%) take only the module enclosing their neighbours" in note


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


# The held-out case captured on the H200 itself (benchmarks/graph_profile_gpu.py): the same decode
# step run from a real CUDA graph and eagerly, with the truth timed part by part in separate runs
# (each module's own graph replayed alone), so the truth shares come from neither trace.
REAL_GRAPH = DATA / "h200_graph_replay_cap262144.json.gz"
REAL_EAGER = DATA / "h200_graph_eager_cap262144.json.gz"


@pytest.fixture(scope="module")
def real_case():
    import json

    truth = json.loads((DATA / "h200_graph_truth.json").read_text())
    graph = load_trace(REAL_GRAPH)
    return truth, analyze(graph, context_length=truth["capacity"]), analyze(
        graph, context_length=truth["capacity"], eager_map=load_trace(REAL_EAGER)), analyze(
        load_trace(REAL_EAGER), context_length=truth["capacity"])


def test_a_real_graph_replay_alone_is_one_opaque_component_and_says_so(real_case):
    _, alone, _, _ = real_case
    assert shares(alone)["cuda_graph"] > 0.9 and alone.capacity_findings == []
    assert any("ran as CUDA-graph replays" in n for n in alone.notes)


def test_a_real_graph_replay_mapped_matches_the_part_by_part_truth_within_5_points(real_case):
    truth, _, mapped, _ = real_case
    got = shares(mapped)
    for component, share in truth["truth_share"].items():
        assert got.get(component, 0.0) == pytest.approx(share, abs=0.05), component
    assert got["indexer"] > 0.9  # the capacity-bound indexer dominates, as timed


def test_a_real_graph_replay_mapped_finds_the_capacity_bound_indexer_as_eager_does(real_case):
    truth, _, mapped, eager = real_case
    (f,) = mapped.capacity_findings
    (e,) = eager.capacity_findings
    assert (f.dim, f.component) == (e.dim, e.component) == (truth["capacity"], "indexer")
    assert set(f.ops) == set(e.ops)
    assert f.ms_per_step == pytest.approx(e.ms_per_step, rel=0.05)  # graph kernel times, not eager's

