"""Floors, predicted tok/s and the gap to a measured step."""

from pathlib import Path

import pytest

from rooftop.errors import RooftopError
from rooftop.hardware import gpu_spec
from rooftop.roofline import decode_costs, floors, gap, load_model_shape, predict_tok_s, prefill_costs

DATA = Path(__file__).parents[1] / "data"
LLAMA = load_model_shape(DATA / "llama-3.1-8b.json")
V4 = load_model_shape(DATA / "deepseek-v4-flash.json")


def test_component_floor_is_the_larger_of_memory_and_compute():
    h200 = gpu_spec("h200")
    prefill = floors(prefill_costs(LLAMA, 4, 2048, weight_dtype="bf16"), h200)
    mlp = prefill.components["dense_mlp"]
    assert mlp.bound == "compute"
    assert mlp.floor_ms == pytest.approx(mlp.flops / 989e12 * 1e3)
    decode = floors(decode_costs(LLAMA, 1, 512, weight_dtype="bf16"), h200)
    assert decode.components["dense_mlp"].bound == "memory"
    assert decode.floor_ms == pytest.approx(sum(c.floor_ms for c in decode.components.values()))


def test_predicted_tok_s_rises_with_concurrency_below_the_knee():
    rates = predict_tok_s(LLAMA, "h200", [1, 8, 64], 512, weight_dtype="bf16")
    assert [r.concurrency for r in rates] == [1, 8, 64]
    assert rates[0].tok_s == pytest.approx(1e3 / rates[0].step_floor_ms)
    assert rates[0].tok_s < rates[1].tok_s < rates[2].tok_s
    assert rates[1].tok_s == pytest.approx(
        8 * rates[0].tok_s, rel=0.1
    )  # memory-bound: step time barely moves


def test_seeds_story_v4_flash_on_four_rtx_pro_6000():
    """A decode step at C=16 should take single-digit ms; the campaign measured ~770 ms."""
    cost = decode_costs(V4, 16, 512, tp=4, weight_dtype="fp8", expert_dtype="mxfp4", kv_dtype="fp8")
    step = floors(cost, "rtx-pro-6000")
    assert 2 < step.floor_ms < 10
    g = gap(step, 770.0)
    assert g.ratio > 75 and g.component == "routed_experts" and g.basis == "proportional to floors"
    # The capacity-bound indexer over a 1M context is where most of a ~1M-capacity floor goes.
    capped = floors(
        decode_costs(
            V4,
            16,
            512,
            tp=4,
            weight_dtype="fp8",
            expert_dtype="mxfp4",
            kv_dtype="fp8",
            context_capacity=1 << 20,
        ),
        "rtx-pro-6000",
    )
    assert capped.components["indexer"].floor_ms > 20 * step.components["indexer"].floor_ms
    assert max(capped.components, key=lambda n: capped.components[n].floor_ms) == "indexer"


def test_gap_with_measured_components_picks_the_largest_excess():
    step = floors(decode_costs(LLAMA, 1, 512, weight_dtype="bf16"), "h200")
    mlp_floor = step.components["dense_mlp"].floor_ms
    measured = {"dense_mlp": mlp_floor + 0.5, "attn_core": 4.0, "other": 1.0}
    g = gap(step, 10.0, measured)
    assert g.component == "attn_core" and g.basis == "measured components"
    assert g.excess_ms["attn_core"] == pytest.approx(4.0 - step.components["attn_core"].floor_ms)
    assert g.excess_ms["other"] == 1.0
    assert g.ratio == pytest.approx(10.0 / step.floor_ms)
    with pytest.raises(RooftopError):
        gap(step, 0)


def test_gap_accepts_profile_family_names():
    step = floors(decode_costs(V4, 16, 512, tp=4), "rtx-pro-6000")
    moe_floor = step.components["routed_experts"].floor_ms + step.components["shared_experts"].floor_ms
    g = gap(step, 100.0, {"moe": moe_floor + 1.0, "attention": 60.0, "indexer": 30.0, "other": 9.0})
    attention_floor = step.components["attn_proj"].floor_ms + step.components["attn_core"].floor_ms
    assert g.excess_ms["moe"] == pytest.approx(1.0)
    assert g.excess_ms["attention"] == pytest.approx(60.0 - attention_floor)
    assert g.component == "attention"


def test_cpu_floor_uses_measured_figures():
    cpu = gpu_spec("cpu")
    assert cpu.measured and cpu.hbm_bandwidth_gb_s > 0.1
    step = floors(decode_costs(load_model_shape(DATA / "rooftop-tiny.json"), 2, 64), cpu)
    assert step.floor_ms > 0
    assert step.components["attn_proj"].memory_ms == pytest.approx(
        step.components["attn_proj"].bytes / cpu.bandwidth_bytes_s * 1e3
    )
