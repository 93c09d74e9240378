"""Families beyond Llama/Qwen/DeepSeek: Llama-4's interleaved MoE, two-matrix MLPs (GPT-NeoX, GPT-2),
tied embeddings by family default (Gemma), and a note for a model_type rooftop does not know."""

import pytest

from rooftop.roofline import count_params, decode_costs
from rooftop.roofline.config import shape_from_config

LLAMA4_TEXT = {"model_type": "llama4_text", "hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40,
               "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
               "num_experts_per_tok": 1, "vocab_size": 202048, "tie_word_embeddings": False, "use_qk_norm": True}
# EleutherAI/pythia-1b config.json
PYTHIA_1B = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_act": "gelu",
             "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 8, "num_hidden_layers": 16,
             "vocab_size": 50304, "tie_word_embeddings": False, "use_parallel_residual": True, "rotary_pct": 0.25,
             "torch_dtype": "float16"}
# openai-community/gpt2 config.json (GPT-2 key names)
GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new", "n_ctx": 1024,
        "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257}
# google/gemma-2-9b config.json
GEMMA2_9B = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "attention_bias": False, "head_dim": 256,
             "hidden_act": "gelu_pytorch_tanh", "hidden_size": 3584, "intermediate_size": 14336,
             "max_position_embeddings": 8192, "num_attention_heads": 16, "num_hidden_layers": 42,
             "num_key_value_heads": 8, "sliding_window": 4096, "torch_dtype": "bfloat16", "vocab_size": 256000}
# fmt: skip


@pytest.mark.parametrize(("experts", "step", "total", "active"), [
    (16, 1, 107_769_861_120, 17_172_894_720),  # Scout: published 109B (with vision) / 17B
    (128, 2, 400_711_848_960, 17_184_691_200),  # Maverick: published 400B / 17B
])  # fmt: skip
def test_llama4_interleaved_moe_with_shared_expert(experts, step, total, active):
    """Reviewer's hand count: MoE on layers step-1, 2 step-1, ...; every MoE layer adds a shared expert of
    intermediate_size; dense layers are intermediate_size_mlp wide."""
    cfg = {"model_type": "llama4", "text_config": LLAMA4_TEXT | {"num_local_experts": experts,
                                                                 "interleave_moe_layer_step": step}}  # fmt: skip
    s = shape_from_config(cfg)
    assert sum(s.moe_layers) == 48 // step and s.moe_layers[step - 1]
    assert (s.shared_expert_intermediate_size, s.intermediate_size, s.moe_intermediate_size) == (8192, 16384, 8192)
    p = count_params(s)
    assert (p.total, p.active) == (total, active)


def test_llama4_dense_layers_cost_their_own_width():
    cfg = LLAMA4_TEXT | {"num_local_experts": 128, "interleave_moe_layer_step": 2}
    cost = decode_costs(shape_from_config(cfg), 1, 128)
    h, width = 5120, 16384
    assert cost.components["dense_mlp"].bytes == 24 * (3 * h * width * 2 + (h + 2 * width + width + h) * 2)
    assert cost.components["shared_experts"].bytes == 24 * (3 * h * 8192 * 2 + (h + 2 * 8192 + 8192 + h) * 2)


def test_llama4_reads_moe_layers_list_and_top_level_quantization():
    cfg = {"model_type": "llama4", "quantization_config": {"quant_method": "fbgemm_fp8"},
           "text_config": LLAMA4_TEXT | {"num_local_experts": 16, "moe_layers": [1, 3]}}  # fmt: skip
    s = shape_from_config(cfg)
    assert [i for i, m in enumerate(s.moe_layers) if m] == [1, 3]
    assert s.weight_dtype == "fp8"


def test_gpt_neox_mlp_has_two_matrices():
    """Pythia-1B: 1,011,781,632 parameters (the checkpoint's count; reviewer's hand count)."""
    s = shape_from_config(PYTHIA_1B)
    assert not s.gated_mlp and s.mlp_bias and s.norm_bias and s.qkv_bias and not s.tie_word_embeddings
    assert count_params(s).total == 1_011_781_632
    h, width = 2048, 8192
    cost = decode_costs(s, 1, 128)
    assert cost.components["dense_mlp"].bytes == 16 * (2 * h * width * 2 + (h + width + width + h) * 2)
    assert cost.components["dense_mlp"].flops == 16 * 2.0 * 2 * h * width


def test_gpt2_key_names_and_tied_head():
    s = shape_from_config(GPT2)
    assert (s.hidden_size, s.num_layers, s.num_heads, s.intermediate_size) == (768, 12, 12, 3072)
    assert s.tie_word_embeddings and not s.gated_mlp
    # 124,439,808 in the checkpoint, of which 786,432 are learned position embeddings (not modelled).
    assert count_params(s).total == 124_439_808 - 1024 * 768


def test_gemma_ties_embeddings_without_the_key():
    """Gemma-2-9B: 9,241,705,984 parameters, the LM head tied to the embedding, four norms per layer."""
    s = shape_from_config(GEMMA2_9B)
    assert s.tie_word_embeddings and s.norms_per_layer == 4
    p = count_params(s)
    assert p.lm_head == 0 and p.total == 9_241_705_984
    assert not shape_from_config(GEMMA2_9B | {"tie_word_embeddings": False}).tie_word_embeddings
    assert not shape_from_config(PYTHIA_1B | {"tie_word_embeddings": None}).tie_word_embeddings


def test_unknown_model_type_is_noted():
    cfg = {"model_type": "mystery", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "intermediate_size": 128}  # fmt: skip
    s = shape_from_config(cfg)
    assert len(s.notes) == 1 and "'mystery' not recognised" in s.notes[0] and "gated MLP" in s.notes[0]
    assert not shape_from_config(cfg | {"model_type": "llama"}).notes
