import json

import pytest
import torch

from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.batch import build_batch
from rooftop.engine.model.config import PRESETS, ModelConfig, count_params
from rooftop.engine.model.model import DSAModel
from rooftop.engine.model.weights import load_model, random_model, save_model

SMALL = ModelConfig(
    hidden_size=64, num_hidden_layers=2, intermediate_size=96, moe_intermediate_size=32,
    n_routed_experts=4, num_experts_per_tok=2, num_attention_heads=2, q_lora_rank=32,
    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    index_n_heads=8, index_head_dim=16, index_topk=8,
)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: these ops are tiny, and on a busy 2-core box threads mostly wait on each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def prefill_logits(model, tokens, block_size=8):
    cache = KVCache(model.config, 8, block_size, model.dtype)
    batch = build_batch([tokens], [0], [[3, 1, 5, 0]], block_size, 64)
    return model(batch, cache)


def test_save_load_round_trip_gives_identical_logits(tmp_path):
    model = random_model(SMALL, seed=3)
    save_model(model, tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["model_type"] == "rooftop_dsa"
    loaded = load_model(tmp_path / "m")
    assert loaded.config == SMALL
    tokens = torch.randint(0, 256, (20,)).tolist()
    assert torch.equal(prefill_logits(model, tokens), prefill_logits(loaded, tokens))
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_tied_embeddings_round_trip(tmp_path):
    config = ModelConfig(**{**SMALL.to_dict(), "tie_word_embeddings": True})
    model = random_model(config, seed=1)
    assert model.lm_head.weight is model.embedding.weight
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.lm_head.weight is loaded.embedding.weight
    assert torch.equal(loaded.lm_head.weight, model.embedding.weight)


def test_mtp_weights_are_drawn_after_the_models_and_saved_with_them(tmp_path):
    assert PRESETS["tiny"].num_nextn_predict_layers == PRESETS["small"].num_nextn_predict_layers == 1
    with_mtp = ModelConfig(**{**SMALL.to_dict(), "num_nextn_predict_layers": 1})
    plain, model = random_model(SMALL, seed=4), random_model(with_mtp, seed=4)
    state = model.state_dict()
    # the seed draws the same main model with or without the module
    assert all(torch.equal(v, state[k]) for k, v in plain.state_dict().items())
    assert {k.split(".")[2] for k in state if k.startswith("mtp.0.")} == {"enorm", "hnorm", "eh_proj", "block"}
    assert state["mtp.0.eh_proj.weight"].shape == (SMALL.hidden_size, 2 * SMALL.hidden_size)
    assert not torch.equal(state["mtp.0.eh_proj.weight"], torch.zeros_like(state["mtp.0.eh_proj.weight"]))
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.config.num_nextn_predict_layers == 1
    for (name, a), b in zip(state.items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_seed_decides_weights():
    a, b, c = random_model(SMALL, seed=0), random_model(SMALL, seed=0), random_model(SMALL, seed=1)
    wa, wb, wc = (m.layers[1].moe.experts.w13 for m in (a, b, c))
    assert torch.equal(wa, wb)
    assert not torch.equal(wa, wc)
    assert torch.all(a.layers[0].attn_norm.weight == 1)
    # 1/sqrt(fan_in) init: the std of a [*, 64] weight is about 1/8.
    assert abs(a.layers[0].attn.q_a_proj.weight.std().item() - 64**-0.5) < 0.02


def test_bfloat16_load(tmp_path):
    save_model(random_model(SMALL, seed=2), tmp_path)
    model = load_model(tmp_path, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    logits = prefill_logits(model, [1, 2, 3, 4, 5])
    assert logits.dtype == torch.float32
    # finite wherever the text mask allows a token (the rest is -inf by design)
    allowed = torch.isfinite(logits[0])
    assert allowed[ord("a")] and not allowed[0x80] and not torch.isnan(logits).any()
    assert torch.isfinite(logits[:, allowed]).all()


def test_mismatched_config_is_refused(tmp_path):
    save_model(random_model(SMALL, seed=0), tmp_path)
    other = ModelConfig(**{**SMALL.to_dict(), "hidden_size": 32})
    other.to_json(tmp_path / "config.json")
    with pytest.raises((ValueError, RuntimeError)):
        load_model(tmp_path)


def test_config_json_round_trip_ignores_unknown_keys(tmp_path):
    data = {**PRESETS["small"].to_dict(), "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert ModelConfig.from_json(tmp_path) == PRESETS["small"]
    assert ModelConfig.preset("tiny") == PRESETS["tiny"]
    assert ModelConfig.preset("tiny") is not PRESETS["tiny"]
    with pytest.raises(KeyError):
        ModelConfig.preset("huge")


def test_param_count_matches_built_model():
    for config in (SMALL, PRESETS["tiny"], ModelConfig(**{**SMALL.to_dict(), "tie_word_embeddings": True})):
        model = DSAModel(config)
        mtp = sum(p.numel() for p in model.mtp.parameters())  # counted apart from the main model's
        assert count_params(config).mtp == mtp and (mtp > 0) == (config.num_nextn_predict_layers > 0)
        assert count_params(config).total == sum(p.numel() for p in model.parameters()) - mtp
        per_expert = 3 * config.hidden_size * config.moe_intermediate_size
        n_moe = config.num_hidden_layers - config.first_k_dense_replace
        inactive = n_moe * (config.n_routed_experts - config.num_experts_per_tok) * per_expert
        assert count_params(config).active_per_token == count_params(config).total - inactive
    small = count_params(PRESETS["small"])
    assert 1.0e9 <= small.total <= 2.0e9
