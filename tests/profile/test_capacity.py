import pytest

from rooftop.profile import analyze, capacity_scaling, load_trace
from rooftop.profile.capacity import derived_sizes


def test_derived_sizes():
    sizes = {s.value: s.derived_from for s in derived_sizes(262144, 64, 32)}
    assert set(sizes) == {262144, 262208, 32}
    assert "one page more" in sizes[262208]
    sizes = {s.value for s in derived_sizes(1000, 256, None)}
    assert sizes == {1000, 1024, 1280}
    assert derived_sizes(None, None, None) == []


def test_static_finding_names_the_indexer_ops(traces):
    s = analyze(load_trace(traces["capacity"]), context_length=8192)
    f = s.capacity_findings[0]
    assert f.dim == 8256 and "one page more" in f.derived_from
    assert f.component == "indexer" and f.path == "DSAModel/DecoderLayer/MLAttention/Indexer"
    # the capacity-sized ops the toy indexer runs (ones, bmm, relu, mul, sum); which of the cheap ones pass
    # the 1%-of-the-finding cut depends on this CPU's timing (aten::sum fell under it on a loaded machine)
    assert "aten::bmm" in f.ops and len({"aten::mul", "aten::sum", "aten::clamp_min", "aten::fill_"} & set(f.ops)) >= 2
    assert "sized by the allocated capacity" in s.findings()[0] and "indexer" in s.findings()[0]


def test_actual_bound_has_no_capacity_finding(traces):
    s = analyze(load_trace(traces["actual"]), context_length=8192)
    assert s.capacity_findings == []
    assert any(c.name == "indexer" for c in s.components)  # still attributed, just not capacity-sized


def test_gpu_trace_finding_is_the_seeds_262208(gpu_trace_path):
    s = analyze(load_trace(gpu_trace_path), context_length=262144)
    assert [f.dim for f in s.capacity_findings] == [262208]
    f = s.capacity_findings[0]
    assert f.ops == ["aten::bmm", "aten::clamp_min", "aten::mul", "aten::sum"]
    assert f.ms_per_step == pytest.approx(0.8) and f.component == "indexer"


def test_dynamic_scaling_finds_the_indexer(gpu_small_cap_path, gpu_trace_path):
    found = capacity_scaling(load_trace(gpu_small_cap_path), load_trace(gpu_trace_path))
    assert found[0].component == "indexer" and found[0].scales
    assert found[0].ms_per_step_small == pytest.approx(0.2) and found[0].ms_per_step_large == pytest.approx(0.8)
    assert found[0].ratio == pytest.approx(4.0)
    assert "scales with allocated capacity, not with actual context" in found[0].sentence()
    others = {f.component: f for f in found[1:]}
    assert set(others) == {"attention", "moe", "cuda_graph"} and not any(f.scales for f in others.values())


def test_a_capacity_that_equals_a_weight_width_finds_nothing(traces):
    """vLLM tiny DeepSeek-V2 at max-model-len 1024: its MLP's gate_up is 1024 wide, no context at all."""
    found = analyze(load_trace(traces["capacity"]), context_length=8192)
    assert 8256 in {f.dim for f in found.capacity_findings}
    s = analyze(load_trace(traces["capacity"]), context_length=8192, model_dims={256, 8256})
    assert all(f.dim != 8256 for f in s.capacity_findings)
    assert any("(one page more) = 8256 equals a width of the model's own weights" in n for n in s.notes)
