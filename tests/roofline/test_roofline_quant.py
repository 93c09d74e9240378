"""Stored dtypes from quantization_config and torch_dtype, and the modules a quantization leaves alone."""

import copy
import json
from pathlib import Path

import pytest

from rooftop.hardware import gpu_spec
from rooftop.roofline import decode_costs, load_model_shape
from rooftop.roofline.config import shape_from_config
from rooftop.roofline.quant import left_unquantized
from rooftop.roofline.report import roofline, roofline_json

DATA = Path(__file__).parents[1] / "data"
LLAMA = json.loads((DATA / "llama-3.1-8b.json").read_text())
# Llama-3.1-8B without embedding and LM head: 32 layers x (attention 4096x(4096+2x1024+4096) + MLP 3x4096x14336).
LLAMA_BODY = 32 * (4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336)
ACT = 32 * 2 * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + (4096 + 2 * 14336) + (14336 + 4096))

CT_FP8 = {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
          "config_groups": {"group_0": {"targets": ["Linear"],
              "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
              "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}}}
CT_W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}}
CT_NVFP4 = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}}}
# fmt: skip


def llama_with(quant: dict | None, **keys) -> dict:
    cfg = copy.deepcopy(LLAMA) | keys
    if quant:
        cfg["quantization_config"] = quant
    return cfg


@pytest.mark.parametrize(
    ("quant", "dtype", "bytes_per_elem"),
    [
        (CT_FP8, "fp8", 1 + 4 / 16384),
        (CT_W4A16, "int4", 0.5 + 4 / 128),
        (CT_NVFP4, "nvfp4", 0.5 + 1 / 16),
        ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "int8", 1.0),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "int4", 0.5 + 4 / 128),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}, "int4",
         0.5 + 4 / 128),
        ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}, "fp8", 1 + 4 / 16384),
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8", 1 + 4 / 16384),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4", 0.5 + 1 / 16),
    ],
)
def test_quantization_methods_set_the_weight_dtype(quant, dtype, bytes_per_elem):
    """The reviewer's repro: all of these read as bf16 before (13.96 GB of attention and MLP weights)."""
    s = shape_from_config(llama_with(quant))
    assert s.weight_dtype == dtype and not s.notes
    cost = decode_costs(s, 1, 1024)
    weights = cost.components["attn_proj"].bytes + cost.components["dense_mlp"].bytes
    per_tensor = 6 * 32 * 4 if dtype == "nvfp4" else 0  # nvfp4's fp32 per tensor (q, k, v, o, gate_up, down)
    assert weights == pytest.approx(LLAMA_BODY * bytes_per_elem + per_tensor + ACT, rel=1e-9)


def test_unknown_quant_method_is_noted_not_silently_bf16():
    s = shape_from_config(llama_with({"quant_method": "quark", "global_quant_config": {}}))
    assert s.weight_dtype == "bf16"
    assert len(s.notes) == 1 and "'quark'" in s.notes[0] and "--weight-dtype" in s.notes[0]
    doc = roofline_json(roofline(s, gpu_spec("h200"), batch=1, context=128))
    assert doc["notes"] == s.notes


def test_float32_config_is_costed_as_bf16_and_says_so():
    """vLLM and SGLang serve a float32 config in bf16 under --dtype auto: 2 bytes per weight, not 4."""
    s = shape_from_config(llama_with(None, torch_dtype="float32"))
    assert (s.weight_dtype, s.base_dtype) == ("bf16", "bf16")
    assert any("float32" in n and "bf16" in n for n in s.notes)
    cost = decode_costs(s, 1, 1024)
    weights = cost.components["attn_proj"].bytes + cost.components["dense_mlp"].bytes
    assert weights == LLAMA_BODY * 2 + ACT
    assert shape_from_config(llama_with(None, torch_dtype="float16")).weight_dtype == "fp16"


def test_gpt_oss_keeps_attention_router_embedding_and_head_in_bf16():
    """modules_to_not_convert: attention bf16 (reviewer's hand 2.007 GB at batch 64), experts mxfp4."""
    oss = load_model_shape(DATA / "gpt-oss-120b.json")
    cost = decode_costs(oss, 64, 32768)
    attn_elems = 36 * (2880 * 4096 + 2 * 2880 * 512 + 4096 * 2880)  # the reviewer's hand adds the biases
    act = 36 * 64 * 2 * ((2880 + 4096) + 2 * (2880 + 512) + (4096 + 2880))  # (8000 per layer: 0.03%)
    assert cost.components["attn_proj"].bytes == attn_elems * 2 + act
    assert round(cost.components["attn_proj"].bytes / 1e9, 3) == 2.007
    assert cost.components["attn_proj"].compute_dtype == "bf16"
    assert cost.components["routed_experts"].compute_dtype == "fp4"
    doc = roofline_json(roofline(oss, gpu_spec("h200"), batch=1, context=128))
    assert doc["dtypes"] == {"attn_proj": "bf16", "routed_experts": "mxfp4", "router": "bf16",
                             "embedding": "bf16", "lm_head": "bf16"}  # fmt: skip


def test_weight_dtype_override_leaves_unconverted_modules_alone():
    oss = load_model_shape(DATA / "gpt-oss-120b.json")
    fp8 = roofline(oss, gpu_spec("h200"), batch=1, context=128, weight_dtype="fp8")
    assert fp8.dtypes["attn_proj"] == "bf16" and fp8.dtypes["routed_experts"] == "fp8"
    assert any("stay bf16" in n for n in fp8.notes)


def test_ignore_patterns_per_layer_and_component():
    # A compressed-tensors FP8 MoE that keeps its routers and layer 0's MLP in bf16.
    cfg = json.loads((DATA / "qwen3-30b-a3b.json").read_text())
    cfg["quantization_config"] = copy.deepcopy(CT_FP8) | {"ignore": ["lm_head", "re:.*mlp.gate$"]}
    s = shape_from_config(cfg)
    assert s.weight_dtype == s.expert_dtype == "fp8"
    assert roofline(s, gpu_spec("h200"), batch=1, context=64).dtypes["routed_experts"] == "fp8"
    cfg["quantization_config"]["ignore"] = ["model.layers.0.mlp"]
    s = shape_from_config(cfg)
    dtypes = roofline(s, gpu_spec("h200"), batch=1, context=64).dtypes
    assert dtypes["routed_experts"] == "bf16+fp8" and dtypes["attn_proj"] == "fp8"


@pytest.mark.parametrize(
    ("pattern", "name", "hit"),
    [
        ("model.layers.*.self_attn", "model.layers.7.self_attn.q_proj", True),
        ("model.layers.*.mlp.router", "model.layers.7.mlp.router", True),
        ("model.layers.1.mlp", "model.layers.11.mlp.down_proj", False),
        ("model.layers.1.mlp", "model.layers.1.mlp.experts.0.gate_proj", True),
        ("re:.*mlp.gate$", "model.layers.3.mlp.gate", True),
        ("re:.*mlp.gate$", "model.layers.3.mlp.gate_proj", False),
        ("language_model.model.layers.0.feed_forward.shared_expert.down_proj",
         "model.layers.0.feed_forward.shared_expert.down_proj", True),
        ("lm_head", "model.layers.0.self_attn.o_proj", False),
    ],
)  # fmt: skip
def test_module_patterns(pattern, name, hit):
    assert left_unquantized((pattern,), (name,)) is hit
