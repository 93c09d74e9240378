"""The documents say what the profile says of its steps: PLAN gives no 'CUDA graphs' advice for steps that
already ran in CUDA graphs, and SUMMARY keeps the note that a multi-GPU trace's ms per step are per GPU."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "campaign"))

from sample_store import populate  # noqa: E402

from rooftop.campaign.collect import collect  # noqa: E402
from rooftop.campaign.diagnosis import diagnose  # noqa: E402
from rooftop.report.plan_md import next_steps  # noqa: E402

GRAPHED = "the steps as served (CUDA graphs), attributed through an eager run of the same steps"


def _idle_evidence(tmp_path, measured: str):
    st = populate(tmp_path)
    ev = collect(st)
    st.close()
    prof = ev.profiles[ev.baseline]
    prof.device, prof.idle_share, prof.measured = "gpu", 0.9, measured
    prof.busy_ms_per_step = 0.5 * ev.variants[ev.baseline].level(prof.concurrency).tpot_ms
    return ev


def test_idle_advice_leaves_out_cuda_graphs_when_the_steps_ran_in_them(tmp_path):
    ev = _idle_evidence(tmp_path / "a", GRAPHED)
    dx = diagnose(ev)
    idle = next(f for f in dx.findings if f.rule == "idle")
    assert idle.numbers["graphed"] is True and idle.numbers["profile_variant"] == ev.baseline
    steps = next_steps(ev, dx, [], tmp_path)
    assert "Cut host overhead per step (fewer launches, a leaner scheduler, sampling and token hand-out): the " \
           "profiled steps already ran in CUDA graphs." in steps
    assert "(CUDA graphs," not in steps

    ev = _idle_evidence(tmp_path / "b", "the steps as served (eagerly)")
    dx = diagnose(ev)
    assert next(f for f in dx.findings if f.rule == "idle").numbers["graphed"] is False
    assert "Cut host overhead per step (CUDA graphs, fewer launches, leaner scheduler)." in next_steps(ev, dx, [], tmp_path)


def test_profiled_only_idle_sentence_leaves_out_cuda_graphs_too(tmp_path):
    ev = _idle_evidence(tmp_path, GRAPHED)
    ev.profiles[ev.baseline].concurrency = None  # no served level: the profile's own share
    idle = next(f for f in diagnose(ev).findings if f.rule == "idle")
    assert "a leaner step loop (the steps already ran in CUDA graphs) could recover up to ×10.00" in idle.sentence


def test_summary_keeps_the_per_gpu_note_of_a_multi_gpu_trace(tmp_path):
    """A trace of several GPUs gives every ms per step per GPU: SUMMARY's profile section says so (it
    dropped the profile's note, leaving per-GPU figures to read as the step's)."""
    from rooftop.report import summary_md

    st = populate(tmp_path)
    ev = collect(st)
    st.close()
    note = ("kernels ran on 8 GPUs: busy time and every ms per step are per GPU (the mean over the 8), calls per "
            "step too; shares are of all GPUs' kernel time")
    ev.profiles[ev.baseline].notes.append(note)
    text = summary_md.profile(ev)
    section = text.split(f"**{ev.baseline}**")[1].split("| component")[0]
    assert "_Kernels ran on 8 GPUs: busy time and every ms per step are per GPU (the mean over the 8)" in section


def test_summary_says_what_the_floors_assumed(tmp_path):
    """The roofline's notes (a float32 config costed as bf16, a quant_method it does not know) reach SUMMARY."""
    from rooftop.report import summary_md

    st = populate(tmp_path)
    r = st.analysis("baseline", "roofline")
    st.put_analysis("baseline", "roofline", {**r, "notes": ["torch_dtype float32 is costed as bf16 (engines serve it so)"]})
    text = summary_md.roofline(collect(st))
    assert "The floors assume:\n\n- torch_dtype float32 is costed as bf16 (engines serve it so)" in text
