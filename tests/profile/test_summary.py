import pytest

from rooftop.profile import analyze, load_trace


def test_gpu_trace_summary_values(gpu_trace_path):
    s = analyze(load_trace(gpu_trace_path), context_length=262144, page_size=64)
    assert s.basis == "kernels" and s.granularity == "module" and s.arch == "sm_90" and s.steps == 2
    # per step: 300 + 200 + 200 + 100 (indexer) + 50 (flash) + 30 (nvjet) + 5 + 3 (graph) us of kernels
    assert s.gpu_busy_ms_per_step == pytest.approx(0.888)
    # wall: step 1 from 1100 to step 2's first kernel at 2100 us, step 2 from 2100 to its last end 2999 us
    assert s.gpu_idle_share == pytest.approx(1 - 1776 / 1899)
    comps = {c.name: c for c in s.components}
    assert [c.name for c in s.components] == ["indexer", "attention", "moe", "cuda_graph"]
    assert comps["indexer"].share == pytest.approx(800 / 888)
    assert comps["indexer"].path == "DSAModel/DecoderLayer/MLAttention/Indexer"
    assert comps["indexer"].unit_shares == {"CUDA core": pytest.approx(1.0)}
    assert comps["cuda_graph"].path == "DSAModel/cudaGraphLaunch" and comps["cuda_graph"].ms_per_step == pytest.approx(0.008)
    assert s.tensor_core_share == pytest.approx(80 / 888)
    assert s.categories["elementwise"] == pytest.approx(403 / 888)
    assert s.categories["communication"] == pytest.approx(5 / 888)
    assert s.top_kernels[0].name.startswith("sm90_xmma_gemm_f32f32") and s.top_kernels[0].unit == "CUDA core"
    assert any("ran as CUDA-graph replays" in n and "--eager-trace" in n for n in s.notes)


def test_json_schema(gpu_trace_path):
    d = analyze(load_trace(gpu_trace_path), context_length=262144).to_json_dict()
    for key in ("steps", "gpu_busy_ms_per_step", "gpu_idle_share", "components", "categories", "tensor_core_share",
                "capacity_findings", "top_kernels"):
        assert key in d
    assert set(d["components"][0]) == {"name", "path", "share", "ms_per_step", "unit_shares"}
    assert set(d["capacity_findings"][0]) == {"dim", "derived_from", "ops", "component", "ms_per_step"}
    shares = [c["share"] for c in d["components"]]
    assert shares == sorted(shares, reverse=True) and sum(shares) == pytest.approx(1.0)
    assert sum(d["categories"].values()) == pytest.approx(1.0)


def test_cpu_trace_uses_op_self_time(traces):
    s = analyze(load_trace(traces["capacity"]))
    assert s.basis == "cpu_ops" and s.steps == 3
    indexer = next(c for c in s.components if c.name == "indexer")
    assert indexer.path == "DSAModel/DecoderLayer/MLAttention/Indexer"
    # self times partition the busy time: components add up to it
    assert sum(c.ms_per_step for c in s.components) == pytest.approx(s.gpu_busy_ms_per_step)
    assert s.tensor_core_share == 0.0 and s.unit_shares == {"CPU": 1.0}
    assert any("no GPU kernels" in n and "self time" in n for n in s.notes)
    assert any(c.name == "sampler" for c in s.components) and any(c.name == "lm_head" for c in s.components)


def test_without_stacks_attribution_is_by_op_and_says_so(traces):
    s = analyze(load_trace(traces["nostack"]))
    assert s.granularity == "op"
    assert any("coarser" in n for n in s.notes)
    names = {c.name for c in s.components}
    assert "aten::bmm" in names and "indexer" not in names
    bmm = next(c for c in s.components if c.name == "aten::bmm")
    assert any("2x8256x16" in path for path, _ in bmm.paths)  # the op and its shapes name the work


def test_steps_from_root_module_calls_without_step_markers(tmp_path):
    import torch
    from toy_model import DSAModel, Sampler

    model, sampler = DSAModel(capacity=256), Sampler()
    ids, kv = torch.zeros(2, dtype=torch.long), torch.randn(2, 64, 32)
    with torch.inference_mode(), torch.profiler.profile(record_shapes=True, with_stack=True, with_modules=True) as p:
        for _ in range(4):
            ids = sampler(model(ids, kv))
    p.export_chrome_trace(str(tmp_path / "t.json"))
    s = analyze(load_trace(tmp_path / "t.json"))
    assert s.steps == 4
    assert not any("one step" in n for n in s.notes)
    assert any(c.name == "sampler" for c in s.components)  # the sampler runs between model calls


def test_two_gpus_report_per_gpu_times_like_busy(tmp_path):
    from synthetic import DECODE_SHARES, Events, decode_step, eager

    # the same step on GPU 0 (driven by one host thread) and GPU 1 (another), ids kept apart
    t = eager([decode_step()] * 3, ["step"] * 3, device=0)
    other = eager([decode_step()] * 3, [None] * 3, device=1, events=Events())
    for e in other.ev:
        if e["cat"] in ("python_function", "cpu_op", "cuda_runtime"):
            e["pid"] = e["tid"] = 200
        for key in ("correlation", "External id"):
            if key in e["args"]:
                e["args"][key] += 10_000
    t.ev += other.ev
    s = analyze(load_trace(t.dump(tmp_path / "two.json")))
    assert s.devices == 2 and s.gpu_busy_ms_per_step == pytest.approx(0.195)
    assert {c.name: c.share for c in s.components} == pytest.approx(DECODE_SHARES)
    assert sum(c.ms_per_step for c in s.components) == pytest.approx(s.gpu_busy_ms_per_step)  # was twice busy
    top = {k.name: k for k in s.top_kernels}
    assert top["indexer_logits_kernel"].ms_per_step == pytest.approx(0.1) and top["topk_kernel"].calls_per_step == 1
    assert any(n.startswith("kernels ran on 2 GPUs: busy time and every ms per step are per GPU") for n in s.notes)
