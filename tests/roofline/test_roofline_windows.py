"""Per-layer attention windows: layer_types (GPT-OSS), Gemma-2's alternation, Gemma-3's pattern, Qwen's
max_window_layers; decode and prefill attention cost each layer with its own window."""

from pathlib import Path

import pytest

from rooftop.roofline import decode_costs, load_model_shape, prefill_costs
from rooftop.roofline.attention import causal_pairs
from rooftop.roofline.config import shape_from_config

DATA = Path(__file__).parents[1] / "data"

# google/gemma-2-9b config.json (no layer_types: even layers local, odd layers global).
GEMMA2_9B = {
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "attention_bias": False, "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh", "hidden_size": 3584, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "num_attention_heads": 16, "num_hidden_layers": 42,
    "num_key_value_heads": 8, "query_pre_attn_scalar": 256, "sliding_window": 4096, "torch_dtype": "bfloat16",
    "vocab_size": 256000, "cache_implementation": "hybrid",
}  # fmt: skip


def test_gpt_oss_layer_types_alternate_windows():
    oss = load_model_shape(DATA / "gpt-oss-120b.json")
    assert oss.sliding_window == 128
    assert oss.layer_windows == (128, 0) * 18


def test_gpt_oss_decode_reads_full_context_on_full_attention_layers():
    """Reviewer's hand figure: 18 full layers read 32768+1 positions, 18 sliding ones 128+1 (77.654 GB)."""
    cost = decode_costs(load_model_shape(DATA / "gpt-oss-120b.json"), 64, 32768)
    kv_token = 8 * 64 * 2 * 2  # 8 KV heads x 64 x (K, V) x bf16
    qo = 64 * 64 * 2 * 2
    full = 18 * 64 * ((32768 + 1) * kv_token + qo)
    sliding = 18 * 64 * ((128 + 1) * kv_token + qo)
    assert cost.components["attn_core"].bytes == full + sliding
    assert round(cost.components["attn_core"].bytes / 1e9, 3) == 77.654
    assert cost.components["attn_core"].flops == 64 * 4.0 * 64 * 64 * (18 * 32768 + 18 * 128)


def test_gpt_oss_prefill_pairs_per_layer():
    cost = prefill_costs(load_model_shape(DATA / "gpt-oss-120b.json"), 1, 1000)
    full_pairs = 1000 * 1001 // 2
    window_pairs = sum(min(i, 128) for i in range(1, 1001))
    assert causal_pairs(1000, 128) == window_pairs
    assert cost.components["attn_core"].flops == 4.0 * 64 * 64 * 18 * (full_pairs + window_pairs)


def test_gemma2_alternates_local_and_global_layers():
    """Reviewer's hand figure: 21 global layers x 8001 positions + 21 local x 4097 (2.082 GB)."""
    gemma = shape_from_config(GEMMA2_9B)
    assert gemma.layer_windows[:4] == (4096, 0, 4096, 0) and sum(1 for w in gemma.layer_windows if w) == 21
    cost = decode_costs(gemma, 1, 8000)
    kv = 8 * 256 * 2 * 2
    qo = 16 * 256 * 2 * 2
    assert cost.components["attn_core"].bytes == 21 * ((8000 + 1) * kv + qo) + 21 * ((4096 + 1) * kv + qo)
    assert round(cost.components["attn_core"].bytes / 1e9, 3) == 2.082


def test_gemma3_pattern_and_qwen_max_window_layers():
    gemma3 = shape_from_config({**GEMMA2_9B, "model_type": "gemma3_text", "num_hidden_layers": 12,
                                "sliding_window": 1024, "sliding_window_pattern": 6})  # fmt: skip
    assert gemma3.layer_windows == (1024,) * 5 + (0,) + (1024,) * 5 + (0,)
    qwen = load_model_shape(DATA / "qwen2-7b.json")
    assert qwen.layer_windows == () and qwen.window(0) == 0  # use_sliding_window false
    cfg = {"model_type": "qwen2", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 4,
           "num_attention_heads": 4, "intermediate_size": 128, "sliding_window": 32, "use_sliding_window": True,
           "max_window_layers": 2}  # fmt: skip
    assert shape_from_config(cfg).layer_windows == (0, 0, 32, 32)


def test_mistral_window_stays_on_every_layer():
    mistral = load_model_shape(DATA / "mistral-7b.json")
    assert mistral.layer_windows == () and all(mistral.window(layer) == 4096 for layer in range(32))


def test_unknown_layer_type_is_noted_and_costed_full():
    cfg = {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "intermediate_size": 128, "sliding_window": 32,
           "layer_types": ["chunked_attention", "sliding_attention"]}  # fmt: skip
    s = shape_from_config(cfg)
    assert s.layer_windows == (0, 32)
    assert any("chunked_attention" in n and "full attention" in n for n in s.notes)


@pytest.mark.parametrize("context", [64, 5000])
def test_window_caps_decode_positions(context):
    oss = load_model_shape(DATA / "gpt-oss-120b.json")
    one = decode_costs(oss, 1, context).components["attn_core"].flops
    assert one == 4.0 * 64 * 64 * 18 * (context + min(context, 128))
