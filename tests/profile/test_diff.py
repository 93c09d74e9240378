import pytest

from rooftop.profile import diff, load_trace


def test_diff_by_component_and_kernel(gpu_small_cap_path, gpu_trace_path):
    d = diff(load_trace(gpu_small_cap_path), load_trace(gpu_trace_path))
    assert d.components[0].name == "indexer" and d.components[0].delta_ms == pytest.approx(0.6)
    assert all(r.delta_ms == 0 for r in d.components[1:])
    assert d.kernels[0].name.startswith("sm90_xmma_gemm_f32f32") and d.kernels[0].delta_ms == pytest.approx(0.225)
    j = d.to_json_dict()
    assert j["components"][0]["name"] == "indexer"
    assert j["busy_ms_per_step"] == [pytest.approx(0.288), pytest.approx(0.888)]


def test_diff_of_a_trace_with_itself_is_zero(gpu_trace_path):
    t = load_trace(gpu_trace_path)
    d = diff(t, t)
    assert all(r.delta_ms == 0 and r.ratio == 1 for r in d.components + d.kernels)
