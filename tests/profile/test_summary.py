import json
from dataclasses import replace
from pathlib import Path

import pytest

from rooftop.profile import analyze, load_trace
from rooftop.profile.capacity import CapacityFinding
from rooftop.profile.summary import ProfileSummary

DATA = Path(__file__).parent / "data"


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
    assert set(d["components"][0]) == {"name", "path", "share", "ms_per_step", "unit_shares", "paths"}
    assert set(d["capacity_findings"][0]) == {"dim", "derived_from", "ops", "component", "path", "ms_per_step",
                                              "share"}
    shares = [c["share"] for c in d["components"]]
    assert shares == sorted(shares, reverse=True) and sum(shares) == pytest.approx(1.0)
    assert sum(d["categories"].values()) == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["gpu_sm90_small.json", "h200_capacity_ctx262144.json.gz"])
def test_the_summary_round_trips_through_json(name):
    """What a campaign stores is the summary itself: read back from its JSON text, every field is equal,
    the capacity findings records again (a handcrafted trace, and one an H200 wrote)."""
    s = analyze(load_trace(DATA / name), context_length=262144)
    assert s.capacity_findings and s.components[0].paths  # the fields that JSON turns into lists are there
    back = ProfileSummary.from_json_dict(json.loads(json.dumps(s.to_json_dict())))
    assert back == s
    assert isinstance(back.capacity_findings[0], CapacityFinding)
    assert back.capacity_findings[0].dim in (262144, 262208) and back.findings() == s.findings()


def test_an_older_stored_summary_still_loads(gpu_trace_path):
    """A summary as the first campaigns stored it (no trace, unit shares, component paths, capacity path and
    share, attribution source, unattributed share or devices) loads, each missing field at its stand-in."""
    s = analyze(load_trace(gpu_trace_path), context_length=262144)
    d = json.loads(json.dumps(s.to_json_dict()))
    for key in ("trace", "unit_shares", "attribution_source", "unattributed_share", "devices"):
        del d[key]
    for c in d["components"]:
        del c["paths"]
    for f in d["capacity_findings"]:
        del f["path"], f["share"]
    old = ProfileSummary.from_json_dict(d)
    assert old.trace == "" and old.unit_shares == {} and old.devices == 1 and old.components[0].paths == []
    assert old.attribution_source == s.granularity  # what the documents showed for it
    assert old.unattributed_share == s.unattributed_share  # the "other" component's share, as analyze takes it
    assert old.capacity_findings[0].path == "" and old.capacity_findings[0].dim == s.capacity_findings[0].dim
    assert old.components == [replace(c, paths=[]) for c in s.components]
    assert old.top_kernels == s.top_kernels and old.notes == s.notes


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
