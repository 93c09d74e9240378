"""Which eager step maps a graphed step: the one that ran the same kernels, whatever the labels say."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from synthetic import DECODE_SHARES, decode_step, eager, graph, prefill_step  # noqa: E402

from rooftop.profile import analyze, load_trace  # noqa: E402


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
