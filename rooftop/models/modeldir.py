"""config.json for small presets of real architectures, written with a printable-ASCII tokenizer.

    rooftop model init --arch deepseek_v2 --preset tiny models/dsv2-tiny
    vllm serve models/dsv2-tiny --load-format dummy

The configs use each architecture's own Hugging Face keys, so engines build the real model classes
(LlamaForCausalLM, Qwen3MoeForCausalLM, DeepseekV2ForCausalLM) and rooftop's roofline reads them as
it reads a downloaded checkpoint. The DeepSeek-V2 presets keep kv_lora_rank 512 and qk_rope_head_dim
64 at every size: vLLM's CPU MLA backend takes only that 576-wide latent.
"""

import json
from pathlib import Path

from rooftop.errors import RooftopError
from rooftop.models.ascii_tokenizer import MODEL_VOCAB, write_tokenizer

# Sizes per preset: tiny serves on a 2-core CPU in seconds; small is for one GPU.
PRESETS = {
    "tiny": {"hidden": 256, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 512, "experts": 8, "top_k": 2,
             "expert_ffn": 128, "max_len": 2048},
    "small": {"hidden": 1024, "layers": 8, "heads": 16, "kv_heads": 4, "ffn": 2816, "experts": 16, "top_k": 4,
              "expert_ffn": 512, "max_len": 8192},
}


def _common(p: dict) -> dict:
    return {
        "hidden_size": p["hidden"],
        "num_hidden_layers": p["layers"],
        "num_attention_heads": p["heads"],
        "max_position_embeddings": p["max_len"],
        "vocab_size": MODEL_VOCAB,
        "eos_token_id": None,  # the tokenizer has no special tokens: generation ends at max_tokens
        "bos_token_id": None,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
        "use_cache": True,
    }


def _llama(p: dict) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **_common(p),
            "num_key_value_heads": p["kv_heads"], "head_dim": p["hidden"] // p["heads"],
            "intermediate_size": p["ffn"], "attention_bias": False, "mlp_bias": False, "rope_scaling": None}


def _qwen3_moe(p: dict) -> dict:
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **_common(p),
            "num_key_value_heads": p["kv_heads"], "head_dim": p["hidden"] // p["heads"],
            "intermediate_size": p["ffn"], "moe_intermediate_size": p["expert_ffn"], "num_experts": p["experts"],
            "num_experts_per_tok": p["top_k"], "norm_topk_prob": True, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "attention_bias": False, "sliding_window": None, "use_sliding_window": False,
            "rope_scaling": None}


def _deepseek_v2(p: dict) -> dict:
    return {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", **_common(p),
            "num_key_value_heads": p["heads"], "q_lora_rank": None, "kv_lora_rank": 512,
            "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 64,
            "intermediate_size": p["ffn"], "moe_intermediate_size": p["expert_ffn"],
            "n_routed_experts": p["experts"], "num_experts_per_tok": p["top_k"], "n_shared_experts": 1,
            "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
            "topk_method": "greedy", "scoring_func": "softmax", "norm_topk_prob": False,
            "routed_scaling_factor": 1.0, "attention_bias": False, "rope_scaling": None}


ARCHS = {"llama": _llama, "qwen3_moe": _qwen3_moe, "deepseek_v2": _deepseek_v2}


def model_config(arch: str, preset: str) -> dict:
    """The config.json of `arch` at `preset` size; RooftopError naming the choices for an unknown one."""
    if arch not in ARCHS:
        raise RooftopError(f"unknown architecture {arch!r}", f"use one of: {', '.join(ARCHS)}")
    if preset not in PRESETS:
        raise RooftopError(f"unknown preset {preset!r}", f"use one of: {', '.join(PRESETS)}")
    return ARCHS[arch](PRESETS[preset])


def init_model_dir(directory: str | Path, arch: str, preset: str = "tiny", force: bool = False) -> list[Path]:
    """Write config.json and the tokenizer files into `directory`; the paths written.

    An existing config.json is kept unless `force`: a model directory may hold real weights.
    """
    config = model_config(arch, preset)
    directory = Path(directory)
    if (directory / "config.json").exists() and not force:
        raise RooftopError(f"{directory / 'config.json'} already exists",
                           "choose an empty directory, or pass --force to overwrite it")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(config, indent=1) + "\n")
        written = [directory / "config.json", *write_tokenizer(directory, config["max_position_embeddings"])]
    except OSError as exc:
        raise RooftopError(f"cannot write the model directory {directory}: {exc.strerror}",
                           "choose a directory you can write") from None
    return written
