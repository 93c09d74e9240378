"""Which eager step maps a graphed step: the one that ran the same kernels, whatever the labels say; and in a
trace without steps, what is aligned with it: each CUDA-graph replay."""

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from synthetic import DECODE_SHARES, Events, decode_step, eager, graph, prefill_step  # noqa: E402

from rooftop.errors import RooftopError  # noqa: E402
from rooftop.profile import analyze, load_trace  # noqa: E402

DATA = Path(__file__).parent / "data"


def shares(summary) -> dict[str, float]:
    return {c.name: c.share for c in summary.components}


def test_a_map_taken_while_serving_maps_decode_steps_with_its_decode_steps(tmp_path):
    # vLLM and SGLang label every step alike: 3 prefills and 2 decodes under one range name
    mixed = eager([prefill_step(), decode_step(), prefill_step(), decode_step(), prefill_step()], ["step"] * 5,
                  tmp_path / "e.json")
    g = graph([decode_step()] * 3, ["step"] * 3, tmp_path / "g.json")
    s = analyze(load_trace(g), eager_map=load_trace(mixed))
    assert shares(s) == pytest.approx(DECODE_SHARES)  # a prefill map read it as 77% attention, no indexer
    assert any("100% of the step's time matched op for op" in n for n in s.notes)


def test_profiler_step_numbers_do_not_tie_a_step_to_the_map_step_of_that_number(tmp_path):
    e = eager([prefill_step()] + [decode_step()] * 4, [f"ProfilerStep#{i}" for i in range(5)], tmp_path / "e.json")
    g = graph([decode_step()] * 4, [f"ProfilerStep#{i}" for i in range(4)], tmp_path / "g.json")
    s = analyze(load_trace(g), eager_map=load_trace(e))
    assert shares(s) == pytest.approx(DECODE_SHARES)


def test_within_a_phase_label_the_kernels_decide(tmp_path):
    # record_function ranges named by phase: a prefill that ran the decode's kernels is still no decode
    steps = [decode_step(), prefill_step(), decode_step(), prefill_step()]
    e = eager(steps, ["prefill", "prefill", "decode", "decode"], tmp_path / "e.json")
    g = graph([decode_step()] * 2, ["decode"] * 2, tmp_path / "g.json")
    s = analyze(load_trace(g), eager_map=load_trace(e))
    assert shares(s) == pytest.approx(DECODE_SHARES)


def test_a_graph_trace_without_steps_is_aligned_replay_by_replay(tmp_path):
    e = eager([decode_step()] * 4, ["step"] * 4, tmp_path / "e.json")
    g = graph([decode_step()] * 4, [None] * 4, tmp_path / "g.json")  # no ProfilerStep, no record_function
    s = analyze(load_trace(g), eager_map=load_trace(e))
    assert shares(s) == pytest.approx(DECODE_SHARES)  # was 31% indexer, 66% "other": 3 of 4 replays misplaced
    # each launch is a step (steps.py), so each replay meets the map as a step of its own
    assert s.steps == 4 and any("each of the 4 CUDA-graph launches counts as one step" in n for n in s.notes)


def test_a_graph_trace_with_one_launch_and_eager_work_is_aligned_piece_by_piece(tmp_path):
    """One replay and eager kernels after it, no step marks: too few launches for steps, so the trace is one
    step, aligned with the map piece by piece (the replay, then the eager run)."""
    e = eager([decode_step()] * 2, ["step"] * 2, tmp_path / "e.json")
    ev = Events()
    graph([decode_step()], [None], events=ev)
    eager([decode_step()], [None], events=ev, t0=2000.0)
    s = analyze(load_trace(ev.dump(tmp_path / "g.json")), eager_map=load_trace(e))
    assert s.steps == 1 and shares(s) == pytest.approx(DECODE_SHARES)
    assert any("each of its 1 CUDA-graph replays was aligned with the map on its own" in n for n in s.notes)


def test_the_real_h200_replay_without_its_step_ranges_maps_as_with_them(tmp_path):
    with gzip.open(DATA / "h200_graph_replay_cap262144.json.gz") as f:
        top = json.load(f)
    top["traceEvents"] = [e for e in top["traceEvents"] if e.get("cat") not in ("user_annotation", "gpu_user_annotation")]
    (tmp_path / "g.json").write_text(json.dumps(top))
    eager_map = load_trace(DATA / "h200_graph_eager_cap262144.json.gz")
    stepped = analyze(load_trace(DATA / "h200_graph_replay_cap262144.json.gz"), context_length=262144,
                      eager_map=eager_map)
    s = analyze(load_trace(tmp_path / "g.json"), context_length=262144, eager_map=eager_map)
    assert s.steps == stepped.steps == 3  # one step a graph launch: was 1 (the whole trace), every ms 3x
    assert shares(s) == pytest.approx(shares(stepped), abs=0.005)
    (f,) = s.capacity_findings
    assert f.dim == 262144 and f.component == "indexer"
    assert f.ms_per_step == pytest.approx(stepped.capacity_findings[0].ms_per_step, rel=0.01)


def test_a_trace_without_steps_or_replays_is_refused_with_how_to_mark_steps(tmp_path):
    e = eager([decode_step()] * 2, ["step"] * 2, tmp_path / "e.json")
    top = json.loads(e.read_text())
    top["traceEvents"] = [x for x in top["traceEvents"] if x["cat"] not in ("python_function", "user_annotation")]
    (tmp_path / "t.json").write_text(json.dumps(top))
    with pytest.raises(RooftopError, match="no steps to align with the eager map") as err:
        analyze(load_trace(tmp_path / "t.json"), eager_map=load_trace(e))
    assert "ProfilerStep#N" in err.value.fix and "record_function" in err.value.fix


def test_a_replay_captured_without_cpu_ops_still_gets_its_capacity_finding(tmp_path):
    with gzip.open(DATA / "h200_graph_replay_cap262144.json.gz") as f:
        top = json.load(f)
    top["traceEvents"] = [e for e in top["traceEvents"] if e.get("cat") != "cpu_op"]
    (tmp_path / "g.json").write_text(json.dumps(top))
    eager_map = load_trace(DATA / "h200_graph_eager_cap262144.json.gz")
    s = analyze(load_trace(tmp_path / "g.json"), context_length=262144, eager_map=eager_map)
    (f,) = s.capacity_findings  # the mapped kernels carry their eager twins' shapes
    assert (f.dim, f.component) == (262144, "indexer")
    assert f.ms_per_step == pytest.approx(34.0, abs=0.1)
    assert not any("has no CPU ops" in n for n in s.notes)


@pytest.mark.parametrize(("map_file", "ran"), [
    ("h200_graph_replay_cap262144.json.gz", "CUDA-graph replays"),
    ("vllm/vllm_llama_compiled.json.gz", "a torch.compile graph"),
])
def test_a_map_that_is_not_eager_is_refused(map_file, ran):
    target = DATA / map_file
    with pytest.raises(RooftopError, match=f"is not eager: its steps ran {ran}") as err:
        analyze(load_trace(target), eager_map=load_trace(DATA / map_file))
    assert "--enforce-eager" in err.value.fix and '{"eager": true}' in err.value.fix


def test_a_map_with_graphed_steps_beside_eager_ones_maps_through_the_eager_ones(tmp_path):
    # graph replays of a prefill-like step first, then the eager decode steps: only the eager ones are a map
    events = graph([decode_step()] * 2, ["step"] * 2, t0=1000.0)
    e = eager([decode_step()] * 2, ["step"] * 2, tmp_path / "e.json", t0=5000.0, events=events)
    g = graph([decode_step()] * 3, ["step"] * 3, tmp_path / "g.json")
    s = analyze(load_trace(g), eager_map=load_trace(e))
    assert shares(s) == pytest.approx(DECODE_SHARES)
    assert any("2 of the map's steps ran CUDA graphs or torch.compile, which hide modules, and were left out" in n
               for n in s.notes)


def test_a_kernel_fused_across_modules_is_one_call_split_over_them(tmp_path):
    e = eager([decode_step()] * 3, ["step"] * 3, tmp_path / "e.json")
    d = decode_step()
    fused = [d[0], d[1], (None, "fused_attn_out_moe_gate", d[2][2] + d[3][2], None), d[4]]
    g = graph([fused] * 3, ["step"] * 3, tmp_path / "g.json")
    s = analyze(load_trace(g), eager_map=load_trace(e))
    assert shares(s) == pytest.approx(DECODE_SHARES)  # its time split between attention and the MoE
    (k,) = [k for k in s.top_kernels if k.name == "fused_attn_out_moe_gate"]
    assert k.calls_per_step == 1 and k.ms_per_step == pytest.approx(0.07)  # was 2 calls a step


def test_the_graph_note_gives_the_shares_that_took_an_eager_twin_and_those_only_enclosed(tmp_path):
    e = eager([decode_step()] * 2, ["step"] * 2, tmp_path / "e.json")
    d = decode_step()
    extra = [d[0], d[1], (None, "graph_only_kernel", 15.0, None), d[2], d[3], d[4]]  # no eager counterpart
    s = analyze(load_trace(graph([extra] * 2, ["step"] * 2, tmp_path / "g.json")), eager_map=load_trace(e))
    note = next(n for n in s.notes if "ran as CUDA-graph replays" in n)
    assert "those matched op for op (93% of the step's time) take their eager twin's module, op and shapes" in note
    assert "those with no eager counterpart (7%) take only the module enclosing their neighbours" in note
