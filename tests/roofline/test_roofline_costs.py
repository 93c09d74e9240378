"""Bytes and FLOPs per component of decode and prefill steps."""

from pathlib import Path

import pytest

from rooftop.errors import RooftopError
from rooftop.roofline import decode_costs, floors, load_model_shape, prefill_costs

DATA = Path(__file__).parents[1] / "data"


def shape(name: str):
    return load_model_shape(DATA / f"{name}.json")


def test_llama_decode_floor_is_weight_bytes_over_h200_bandwidth():
    """Must-show 2: Llama-3.1-8B, bf16, batch 1, short context, H200."""
    cost = decode_costs(shape("llama-3.1-8b"), 1, 128, weight_dtype="bf16")
    # Every weight is read once except the embedding table, of which one row is read.
    weight_bytes = (8_030_261_248 - 128256 * 4096) * 2
    expected_ms = weight_bytes / 4.8e12 * 1e3
    step = floors(cost, "h200")
    assert step.floor_ms == pytest.approx(expected_ms, rel=0.02)
    assert cost.components["embedding"].bytes < 1e6
    assert cost.components["lm_head"].bytes == pytest.approx(128256 * 4096 * 2, rel=1e-3)


def test_weight_dtype_scales_projection_bytes_but_not_the_lm_head():
    llama = shape("llama-3.1-8b")
    bf16 = decode_costs(llama, 1, 128, weight_dtype="bf16")
    fp8 = decode_costs(llama, 1, 128, weight_dtype="fp8")
    nvfp4 = decode_costs(llama, 1, 128, weight_dtype="nvfp4")
    ratio = fp8.components["dense_mlp"].bytes / bf16.components["dense_mlp"].bytes
    assert ratio == pytest.approx(0.5, rel=0.01)
    assert nvfp4.components["dense_mlp"].bytes / bf16.components["dense_mlp"].bytes == pytest.approx(
        0.5625 / 2, rel=0.01
    )
    assert fp8.components["lm_head"].bytes == bf16.components["lm_head"].bytes
    assert (
        fp8.components["dense_mlp"].compute_dtype == "fp8"
        and nvfp4.components["dense_mlp"].compute_dtype == "fp4"
    )


def test_tensor_parallel_splits_weights_and_adds_all_reduces():
    llama = shape("llama-3.1-8b")
    one = decode_costs(llama, 4, 256, weight_dtype="bf16")
    two = decode_costs(llama, 4, 256, weight_dtype="bf16", tp=2)
    assert two.components["dense_mlp"].bytes == pytest.approx(one.components["dense_mlp"].bytes / 2, rel=0.01)
    assert one.components["comm_tp"].bytes == 0
    # 2 all-reduces per layer + the embedding one, ring: 2(tp-1)/tp of 4 tokens x 4096 x 2 bytes each.
    reduces = (2 * 32 + 1) * 1.0 * 4 * 4096 * 2
    logits = 4 * 128256 * 4 / 2
    assert two.components["comm_tp"].bytes == pytest.approx(reduces + logits)
    assert two.components["comm_tp"].medium == "link"


def test_mla_latent_is_read_whole_by_every_tp_rank():
    v3 = shape("deepseek-v3")
    one = decode_costs(v3, 1, 4096, kv_dtype="bf16")
    eight = decode_costs(v3, 1, 4096, kv_dtype="bf16", tp=8)
    latent_reads = 61 * 4097 * (512 + 64) * 2
    # Plus each head's absorbed query (512 + 64) in and latent output (512) out, bf16.
    assert one.components["attn_core"].bytes == pytest.approx(latent_reads + 61 * 128 * 1088 * 2)
    assert eight.components["attn_core"].bytes == pytest.approx(latent_reads + 61 * 16 * 1088 * 2)
    # q_a and kv_a projections are replicated, so 8 ranks hold more than an eighth of attention weights.
    assert eight.components["attn_proj"].bytes > one.components["attn_proj"].bytes / 8 * 1.05
    fp8 = decode_costs(v3, 1, 4096, kv_dtype="fp8")
    assert fp8.components["attn_core"].bytes == pytest.approx(61 * (4097 * 656 + 128 * 1088 * 2))


def test_dsa_caps_attention_at_topk_and_indexer_scales_with_scored_length():
    v3, v32 = shape("deepseek-v3"), shape("deepseek-v3.2")
    dense = decode_costs(v3, 2, 100_000).components["attn_core"]
    sparse = decode_costs(v32, 2, 100_000).components["attn_core"]
    activations = 128 * 1088 * 2
    assert dense.bytes == pytest.approx(2 * 61 * (100_001 * 1152 + activations))
    assert sparse.bytes == pytest.approx(2 * 61 * (2049 * 1152 + activations))  # top-2048 positions
    actual = decode_costs(v32, 4, 1_000, kv_dtype="fp8")
    capacity = decode_costs(v32, 4, 1_000, kv_dtype="fp8", context_capacity=100_000)
    assert capacity.components["attn_core"].bytes == actual.components["attn_core"].bytes
    # Per scored position: one fp8 key (128 + a 4-byte scale) read, one fp32 logit written and read.
    extra_positions = 4 * 61 * (100_000 - 1_000)
    grown = capacity.components["indexer"].bytes - actual.components["indexer"].bytes
    assert grown == pytest.approx(extra_positions * (132 + 8))
    assert (
        capacity.components["indexer"].flops / actual.components["indexer"].flops > 10
    )  # projections dilute 100x
    assert actual.scored_context == 1_000 and capacity.scored_context == 100_000


def test_sliding_window_caps_kv_reads():
    mistral, llama = shape("mistral-7b"), shape("llama-3.1-8b")
    short = decode_costs(mistral, 1, 4096).components["attn_core"].bytes
    long = decode_costs(mistral, 1, 16384).components["attn_core"].bytes
    assert long == pytest.approx(short, rel=1e-3)
    grown = (
        decode_costs(llama, 1, 16384).components["attn_core"].bytes
        / decode_costs(llama, 1, 4096).components["attn_core"].bytes
    )
    assert grown == pytest.approx(4, rel=0.01)


def test_routed_experts_read_only_the_distinct_experts():
    mixtral = shape("mixtral-8x7b")
    expert_bytes = 3 * 4096 * 14336 * 2
    one = decode_costs(mixtral, 1, 128, weight_dtype="bf16").components["routed_experts"]
    assert one.bytes == pytest.approx(32 * 2 * expert_bytes, rel=0.01)  # batch 1: top-2 of 8
    many = decode_costs(mixtral, 256, 128, weight_dtype="bf16").components["routed_experts"]
    assert many.bytes == pytest.approx(32 * 8 * expert_bytes, rel=0.02)  # every expert
    assert many.flops == pytest.approx(2 * 256 * 2 * 3 * 4096 * 14336 * 32, rel=1e-3)


def test_expert_parallel_keeps_bytes_per_gpu_and_adds_all_to_all():
    v3 = shape("deepseek-v3")
    tp = decode_costs(v3, 32, 512, tp=8)
    ep = decode_costs(v3, 32, 512, tp=8, ep=8)
    assert ep.components["routed_experts"].bytes == pytest.approx(tp.components["routed_experts"].bytes)
    assert tp.components["comm_ep"].bytes == 0 < ep.components["comm_ep"].bytes
    assert ep.components["comm_tp"].bytes < tp.components["comm_tp"].bytes  # MoE all-reduces gone


def test_prefill_matmul_flops_are_two_per_parameter_per_token():
    llama = shape("llama-3.1-8b")
    cost = prefill_costs(llama, 2, 512, weight_dtype="bf16")
    per_layer = 4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336
    assert (
        cost.components["attn_proj"].flops + cost.components["dense_mlp"].flops == 2 * 1024 * 32 * per_layer
    )
    # Causal attention: 512*513/2 (query, key) pairs per sequence and layer, 4 FLOPs per pair per head dim.
    assert cost.components["attn_core"].flops == 2 * 32 * 4 * 32 * 128 * (512 * 513 // 2)
    assert cost.components["lm_head"].flops == 2 * 2 * 128256 * 4096  # last position only


def test_v4_attention_positions_per_layer_type():
    v4 = shape("deepseek-v4-flash")
    cost = decode_costs(v4, 1, 1000)
    # Windows of 128 everywhere; c4 layers add top-512 of 250 entries, c128 layers all 7.
    positions = 2 * 128 + 21 * (128 + 250) + 20 * (128 + 7)
    assert cost.components["attn_core"].flops == pytest.approx(4 * 64 * 512 * positions)
    long = decode_costs(v4, 1, 100_000)
    positions = 2 * 128 + 21 * (128 + 512) + 20 * (128 + 781)
    assert long.components["attn_core"].flops == pytest.approx(4 * 64 * 512 * positions)
    projections = 2 * (1024 * 64 * 128 + 4096 * 64 + 2 * 4096 * 2 * 128)  # wq, weights_proj, compressor
    scoring = (2 * 64 * 128 + 3 * 64) * 25_000  # 100k / 4 compressed keys, 64 heads x 128
    assert long.components["indexer"].flops == pytest.approx(21 * (projections + scoring))


def test_engine_config_costs():
    tiny = shape("rooftop-tiny")
    cost = decode_costs(tiny, 8, 100, context_capacity=4096)
    assert all(
        cost.components[name].bytes > 0
        for name in (
            "attn_proj",
            "attn_core",
            "indexer",
            "routed_experts",
            "shared_experts",
            "dense_mlp",
            "lm_head",
        )
    )
    grown = cost.components["indexer"].bytes - decode_costs(tiny, 8, 100).components["indexer"].bytes
    assert grown == 8 * 4 * (4096 - 100) * (32 * 2 + 8)  # bf16 keys of 32, fp32 logits written and read


def test_bad_layouts_are_user_errors():
    llama = shape("llama-3.1-8b")
    with pytest.raises(RooftopError, match="does not divide"):
        decode_costs(llama, 1, 128, tp=2, ep=4)
    with pytest.raises(RooftopError, match="heads"):
        decode_costs(llama, 1, 128, tp=3)
    with pytest.raises(RooftopError, match="capacity"):
        decode_costs(llama, 1, 128, context_capacity=64)
    with pytest.raises(RooftopError, match="batch"):
        decode_costs(llama, 0, 128)
    with pytest.raises(RooftopError, match="dtype"):
        decode_costs(llama, 1, 128, weight_dtype="fp5")
