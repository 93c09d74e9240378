"""Reading config.json files: every family, and clear errors for what cannot be read."""

import json
from pathlib import Path

import pytest

from rooftop.errors import RooftopError
from rooftop.roofline import load_model_shape

DATA = Path(__file__).parents[1] / "data"


def test_gqa_families():
    llama = load_model_shape(DATA / "llama-3.1-8b.json")
    assert (llama.attention, llama.num_kv_heads, llama.head_dim, llama.qkv_bias) == ("gqa", 8, 128, False)
    assert load_model_shape(DATA / "qwen2-7b.json").qkv_bias
    assert load_model_shape(DATA / "qwen2-7b.json").sliding_window == 0  # use_sliding_window false
    assert load_model_shape(DATA / "mistral-7b.json").sliding_window == 4096
    assert load_model_shape(DATA / "qwen3-8b.json").qk_norm
    mixtral = load_model_shape(DATA / "mixtral-8x7b.json")
    assert (mixtral.n_routed_experts, mixtral.experts_per_token, mixtral.moe_intermediate_size) == (
        8,
        2,
        14336,
    )
    assert all(mixtral.moe_layers)


def test_deepseek_families():
    v3 = load_model_shape(DATA / "deepseek-v3.json")
    assert v3.attention == "mla" and v3.weight_dtype == "fp8"
    assert v3.moe_layers[:4] == (False, False, False, True) and sum(v3.moe_layers) == 58
    assert not v3.indexer_layers and v3.mtp_layers == 1
    v32 = load_model_shape(DATA / "deepseek-v3.2.json")
    assert all(v32.indexer_layers) and v32.index_topk == 2048
    lite = load_model_shape(DATA / "deepseek-v2-lite.json")
    assert lite.q_lora_rank == 0 and lite.shared_expert_intermediate_size == 2 * 1408


def test_deepseek_v4_layers():
    v4 = load_model_shape(DATA / "deepseek-v4-flash.json")
    assert v4.attention == "csa" and v4.num_kv_heads == 1 and v4.kv_lora_rank == 448
    assert len(v4.compress_ratios) == 43  # the config's tail past 43 belongs to the MTP layer
    assert v4.compress_ratios[:4] == (0, 0, 4, 128) and v4.compress_ratios[42] == 4
    assert [i for i, on in enumerate(v4.indexer_layers) if on] == list(range(2, 43, 2))
    assert (v4.weight_dtype, v4.expert_dtype) == ("fp8", "mxfp4")


def test_engine_config_reads_as_v32(tmp_path):
    tiny = load_model_shape(DATA / "rooftop-tiny.json")
    assert tiny.attention == "mla" and all(tiny.indexer_layers)
    assert tiny.moe_layers == (False, True, True, True)
    # A directory holding config.json works as well as the file.
    (tmp_path / "config.json").write_text((DATA / "rooftop-tiny.json").read_text())
    assert load_model_shape(tmp_path) == tiny


def test_unknown_architecture_names_missing_keys(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mystery", "architectures": ["MysteryLM"], "hidden_size": 64}))
    with pytest.raises(RooftopError) as err:
        load_model_shape(path)
    message = str(err.value)
    assert "MysteryLM" in message and "not recognised" in message
    for key in ("vocab_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        assert key in err.value.problem
    assert "hidden_size," not in err.value.problem  # present keys are not reported missing


def test_missing_mla_and_moe_keys(tmp_path):
    cfg = json.loads((DATA / "deepseek-v3.2.json").read_text())
    del cfg["kv_lora_rank"], cfg["index_topk"]
    (tmp_path / "a.json").write_text(json.dumps(cfg))
    with pytest.raises(RooftopError, match="kv_lora_rank, index_topk"):
        load_model_shape(tmp_path / "a.json")
    cfg = json.loads((DATA / "mixtral-8x7b.json").read_text())
    del cfg["num_experts_per_tok"]
    (tmp_path / "b.json").write_text(json.dumps(cfg))
    with pytest.raises(RooftopError, match="num_experts_per_tok"):
        load_model_shape(tmp_path / "b.json")


def test_unreadable_files(tmp_path):
    with pytest.raises(RooftopError, match="not found"):
        load_model_shape(tmp_path / "nope.json")
    with pytest.raises(RooftopError, match="not found"):
        load_model_shape(tmp_path)  # a directory without config.json
    cfg = json.loads((DATA / "llama-3.1-8b.json").read_text())
    cfg["hidden_size"] = "wide"
    (tmp_path / "nan.json").write_text(json.dumps(cfg))
    with pytest.raises(RooftopError, match="not a number"):
        load_model_shape(tmp_path / "nan.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(RooftopError, match="not valid JSON"):
        load_model_shape(tmp_path / "bad.json")
