"""Which ranges are a trace's steps: vLLM's step ranges are named by their batch, so labels differ in numbers."""

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from synthetic import decode_step, eager, graph  # noqa: E402

from rooftop.profile import analyze, load_trace  # noqa: E402
from rooftop.profile.steps import find_steps, label_phase  # noqa: E402

DATA = Path(__file__).parent / "data"


def test_label_phase_drops_step_numbers_and_batch_counts():
    assert label_phase("ProfilerStep#12") == "ProfilerStep#"
    assert label_phase("execute_context_1(32)_generation_3(3)") == label_phase("execute_context_0(0)_generation_2(2)")
    assert label_phase("decode_step") == "decode_step"


def test_vllm_steps_whose_batch_changes_are_all_steps(tmp_path):
    with gzip.open(DATA / "vllm" / "vllm_llama_eager.json.gz") as f:
        top = json.load(f)
    ranges = sorted((e for e in top["traceEvents"] if e.get("cat") == "user_annotation"
                     and e["name"].startswith("execute_context")), key=lambda e: e["ts"])
    labels = ["execute_context_0(0)_generation_2(2)", "execute_context_0(0)_generation_2(2)",
              "execute_context_1(32)_generation_1(1)", "execute_context_0(0)_generation_3(3)",
              "execute_context_0(0)_generation_4(4)"]
    for e, label in zip(ranges, labels, strict=True):
        e["name"] = label
    (tmp_path / "t.json").write_text(json.dumps(top))
    found = find_steps(load_trace(tmp_path / "t.json"))
    assert [s.label for s in found.steps] == labels and found.notes == []  # was: the 2 alike only
    s = analyze(load_trace(tmp_path / "t.json"))
    same = analyze(load_trace(DATA / "vllm" / "vllm_llama_eager.json.gz"))
    assert s.steps == 5 and s.gpu_busy_ms_per_step == same.gpu_busy_ms_per_step
    assert [(c.name, c.share) for c in s.components] == [(c.name, c.share) for c in same.components]


def test_ranges_outside_every_step_are_named_in_a_note(tmp_path):
    t = eager([decode_step()] * 4, ["step", "step", "step", "warm_up"], tmp_path / "e.json")
    found = find_steps(load_trace(t))
    assert len(found.steps) == 3
    (note,) = found.notes
    assert note.startswith("1 record_function range(s) outside the steps ('warm_up') are left out of every step")
    assert any("'warm_up') are left out" in n for n in analyze(load_trace(t)).notes)


def test_unmarked_graph_replays_are_steps_one_launch_each(tmp_path):
    """Graph replays with no step range: each cudaGraphLaunch of the launching thread starts a step (4 here,
    with a launch of another thread's graph left out); one launch alone leaves the trace one step."""
    ev = graph([decode_step()] * 4, [None] * 4)
    ev.x("cuda_runtime", "cudaGraphLaunch", 1500.0, 5.0, tid=999, correlation=ev.corr)  # a side thread's one
    found = find_steps(load_trace(ev.dump(tmp_path / "g.json")))
    assert len(found.steps) == 4 and {s.label for s in found.steps} == {"cudaGraphLaunch"}
    assert all(a.end_ns == b.start_ns for a, b in zip(found.steps, found.steps[1:], strict=False))
    assert "each of the 4 CUDA-graph launches counts as one step" in found.notes[0]
    s = analyze(load_trace(tmp_path / "g.json"))
    assert s.steps == 4 and s.gpu_busy_ms_per_step * 1e3 == pytest.approx(195, abs=1)
    one = graph([decode_step()], [None], tmp_path / "one.json")
    assert find_steps(load_trace(one)).steps == []
    assert analyze(load_trace(one)).steps == 1
