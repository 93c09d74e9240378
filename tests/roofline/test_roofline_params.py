"""Parameter counts against published figures and exact checkpoint counts."""

from pathlib import Path

import pytest

from rooftop.roofline import count_params, load_model_shape

DATA = Path(__file__).parents[1] / "data"


def params(name: str):
    return count_params(load_model_shape(DATA / f"{name}.json"))


def within_published(value: float, published_b: float, digits: int, tol: float = 0.01) -> bool:
    """True when `value` lies within tol of the interval a figure rounded to `digits` decimals stands for.

    "3.3B" only says the count lies in [3.25B, 3.35B); 1% is taken from the ends of that interval.
    """
    half_ulp = 0.5 * 10**-digits
    low, high = (published_b - half_ulp) * 1e9, (published_b + half_ulp) * 1e9
    return low * (1 - tol) <= value <= high * (1 + tol)


# (config, published total B, decimals, published active B, decimals): model cards and papers.
PUBLISHED = [
    ("llama-3.1-8b", 8.03, 2, 8.03, 2),
    ("mixtral-8x7b", 46.7, 1, 12.9, 1),
    ("qwen3-30b-a3b", 30.5, 1, 3.3, 1),
    ("deepseek-v3", 671, 0, 37, 0),
]


@pytest.mark.parametrize("name,total_b,total_digits,active_b,active_digits", PUBLISHED)
def test_published_totals_and_actives_within_one_percent(
    name, total_b, total_digits, active_b, active_digits
):
    p = params(name)
    assert within_published(p.total, total_b, total_digits), p.total
    assert within_published(p.active, active_b, active_digits), p.active
    # The plain 1% test holds too wherever the published figure is not the rounding's edge case.
    assert abs(p.total / (total_b * 1e9) - 1) < 0.01


def test_exact_counts_match_the_checkpoints():
    # Safetensors totals of the HF checkpoints (main model, embeddings and LM head included).
    assert params("llama-3.1-8b").total == 8_030_261_248
    assert params("mixtral-8x7b").total == 46_702_792_704
    assert params("mistral-7b").total == 7_241_732_096
    assert params("qwen2-7b").total == 7_615_616_512  # q/k/v biases included
    assert params("qwen3-8b").total == 8_190_735_360  # q/k norms included


def test_embeddings_and_lm_head_are_separate():
    p = params("llama-3.1-8b")
    assert p.embedding == p.lm_head == 128256 * 4096
    assert not p.tied_embeddings
    assert p.active_non_embedding == p.active - p.embedding
    dense = p.attention + p.dense_mlp + p.norms
    assert dense + p.embedding + p.lm_head == p.total


def test_tied_embeddings_count_once(tmp_path):
    text = (
        (DATA / "qwen3-8b.json")
        .read_text()
        .replace('"tie_word_embeddings": false', '"tie_word_embeddings": true')
    )
    (tmp_path / "config.json").write_text(text)
    tied = count_params(load_model_shape(tmp_path))
    untied = params("qwen3-8b")
    assert tied.lm_head == 0 and tied.tied_embeddings
    assert untied.total - tied.total == 151936 * 4096


def test_deepseek_v3_mtp_is_separate_and_makes_685b():
    p = params("deepseek-v3")
    # DeepSeek: 671B main model + 14B MTP module (the checkpoint stores its own embedding and head copies).
    assert 13.0e9 < p.mtp < 14.5e9
    assert within_published(p.total + p.mtp, 685, 0)
    assert p.routed_experts_active * 32 == p.routed_experts  # 8 of 256 experts
    # DeepSeek counts activated parameters without the input embedding: 37B.
    assert abs(p.active_non_embedding / 37e9 - 1) < 0.011


def test_deepseek_v2_lite_mla_without_q_lora():
    p = params("deepseek-v2-lite")
    assert within_published(p.total, 15.7, 1)
    assert within_published(p.active_non_embedding, 2.4, 1)


def test_deepseek_v4_flash_from_facts():
    p = params("deepseek-v4-flash")
    assert within_published(p.total, 284, 0)
    assert 12.5e9 < p.active_non_embedding < 14e9  # published 13B; attention details unverified
    assert p.indexer > 0 and p.mtp > 0


def test_v32_indexer_adds_to_v3():
    v3, v32 = params("deepseek-v3"), params("deepseek-v3.2")
    per_layer = 1536 * 64 * 128 + 7168 * 64 + 7168 * 128  # wq, weights_proj, wk
    assert v32.indexer == 61 * per_layer
    assert v32.total - v3.total == v32.indexer + 61 * 2 * 128  # plus the key LayerNorm


def test_qwen3_moe_active_counts_eight_of_128_experts():
    p = params("qwen3-30b-a3b")
    expert = 3 * 2048 * 768
    assert p.routed_experts == 48 * 128 * expert
    assert p.routed_experts_active == 48 * 8 * expert


def test_engine_tiny_preset():
    # rooftop-tiny.json is the embedded engine's `tiny` preset as its ModelConfig.to_json writes it;
    # the engine counts 3,900,544 parameters, 2,131,072 active per token.
    p = params("rooftop-tiny")
    assert (p.total, p.active) == (3_900_544, 2_131_072)
