"""Speculative decoding on the roofline: acceptance, the verify step, the draft, the gain and its crossovers."""

import math
from pathlib import Path

import pytest

from rooftop.errors import RooftopError
from rooftop.hardware.specs import GPUSpec
from rooftop.roofline import count_params, decode_costs, load_model_shape
from rooftop.roofline.config import shape_from_config
from rooftop.roofline.speculative import (
    acceptance_rates,
    crossover_batch,
    draft_step_costs,
    expected_tokens,
    first_batch,
    speculative_gain,
    speculative_report,
)

DATA = Path(__file__).parents[1] / "data"
# A Llama of one layer small enough to cost by hand: h 64, 4 heads of 16 (no GQA), MLP 128, vocab 1000.
TOY = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 1,
       "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128, "torch_dtype": "bfloat16"}  # fmt: skip
# 1 GB/s and 1 GFLOP/s: a floor in ms is max(bytes, FLOPs) / 1e6.
UNIT_GPU = GPUSpec("unit", "sm_0", 1, 1, 1.0, 1.0, {"bf16": 1e-3, "fp32": 1e-3})


def llama():
    return load_model_shape(DATA / "llama-3.1-8b.json")


def test_expected_tokens_from_one_rate_and_from_vllms_per_position_rates():
    assert acceptance_rates(3, 0.5) == (0.5, 0.25, 0.125)
    assert expected_tokens(3, 0.5) == pytest.approx(1.875)  # (1 - 0.5^4) / (1 - 0.5)
    assert expected_tokens(3, 0.7) == pytest.approx((1 - 0.7**4) / 0.3)
    assert expected_tokens(3, (0.8, 0.6, 0.4)) == pytest.approx(2.8)  # 1 + the sum
    assert expected_tokens(3, 1.0) == 4.0 and expected_tokens(3, 0.0) == 1.0
    assert expected_tokens(2, (0.5, 0.5)) == 2.0  # a flat tail is allowed: position 2 never missed after 1


@pytest.mark.parametrize(
    ("k", "acceptance", "words"),
    [
        (0, 0.5, "speculative tokens must be a positive integer, got 0"),
        (True, 0.5, "speculative tokens must be a positive integer"),
        (3, 1.2, "acceptance 1.2 is outside [0, 1]"),
        (3, -0.1, "acceptance -0.1 is outside [0, 1]"),
        (3, math.nan, "acceptance nan is outside [0, 1]"),
        (3, (0.8, 0.6), "2 per-position acceptance rates for 3 speculative tokens"),
        (3, (0.8, 1.5, 0.4), "acceptance at position 2 1.5 is outside [0, 1]"),
        (3, (0.8, 0.6, 0.7), "per-position acceptance rises at position 3 (0.7 after 0.6)"),
    ],
)
def test_bad_speculation_is_named(k, acceptance, words):
    with pytest.raises(RooftopError) as err:
        acceptance_rates(k, acceptance)
    assert words in str(err.value)


def test_an_unknown_draft_and_a_bad_concurrency_are_named():
    with pytest.raises(RooftopError, match="unknown draft 'eagle'"):
        speculative_gain(llama(), "h200", 1, 3, 0.5, context=128, draft="eagle")
    with pytest.raises(RooftopError, match="concurrency must be a positive integer, got 0"):
        speculative_report(llama(), "h200", [1, 0], 3, 0.5, context=128)


def test_the_verify_step_of_a_toy_model_by_hand():
    """Batch 2, context 10, k 3: 8 tokens. Weights read once, 8 tokens' activations and FLOPs; each
    sequence's cache read once, its 4 queries' arithmetic 4 times a decode query's; 8 rows of logits."""
    shape = shape_from_config(TOY)
    plain = decode_costs(shape, 2, 10).components
    verify = decode_costs(shape, 2, 10, queries_per_seq=4)
    assert verify.phase == "verify" and verify.tokens == 8 and verify.batch == 2
    comps = verify.components
    # q, k, v, o: 4 x 64 x 64 bf16 weights, then 8 tokens x (64 in + 64 out) x 2 B per matrix.
    assert comps["attn_proj"].bytes == 4 * 4096 * 2 + 4 * 8 * 128 * 2 == 40960
    assert comps["attn_proj"].flops == 2 * 8 * 4 * 4096 == 262144
    # 11 cached positions (10 + the new one) x 4 heads x 16 x K,V x 2 B, plus q and o; per sequence.
    assert comps["attn_core"].bytes == plain["attn_core"].bytes == 2 * (11 * 256 + 256) == 6144
    assert comps["attn_core"].flops == 4 * plain["attn_core"].flops == 4 * 2 * 4 * 4 * 16 * 10 == 20480
    assert comps["dense_mlp"].flops == 2 * 8 * 3 * 64 * 128
    # The head: its whole matrix once, then every verified position's logits in fp32.
    assert comps["lm_head"].bytes == 1000 * 64 * 2 + 8 * (64 * 2 + 1000 * 4) == 161024
    assert comps["lm_head"].flops == 2 * 8 * 1000 * 64


def test_the_gain_of_a_toy_model_by_hand():
    """On 1 GB/s and 1 GFLOP/s every toy component but the cache read is compute-bound; per component,
    max(bytes, FLOPs) / 1e6 ms. Plain, 2 tokens: embedding 512 B, attn_proj 65,536 FLOPs, attention 6,144 B,
    MLP 98,304, norms 1,536, head 256,000. Verify, 8 tokens: 2,048 B, 262,144, 20,480 FLOPs (now
    compute-bound), 393,216, 6,144, 1,024,000. ngram draft: free."""
    plain_ms = (512 + 65536 + 6144 + 98304 + 1536 + 256000) / 1e6
    verify_ms = (2048 + 262144 + 20480 + 393216 + 6144 + 1024000) / 1e6
    est = speculative_gain(shape_from_config(TOY), UNIT_GPU, 2, 3, 0.5, context=10, draft="ngram")
    assert est.plain_step_ms == pytest.approx(plain_ms) and est.verify_step_ms == pytest.approx(verify_ms)
    assert est.draft_ms == 0.0 and est.expected_tokens == 1.875
    assert est.spec_ms_per_token == pytest.approx(verify_ms / 1.875)
    assert est.gain == pytest.approx(plain_ms / (verify_ms / 1.875)) == pytest.approx(0.46988, abs=1e-5)
    assert est.verify_bound == "compute"
    assert est.spec_tok_s == pytest.approx(2 * 1.875 / verify_ms * 1e3)


def test_a_weight_bound_step_with_a_free_draft_gains_the_expected_tokens():
    """Batch 1, short context: the verify step reads what a decode step reads, so gain -> E."""
    est = speculative_gain(llama(), "h200", 1, 3, 0.5, context=128, draft="ngram", weight_dtype="bf16")
    assert est.verify_step_ms / est.plain_step_ms == pytest.approx(1.0, abs=0.005)
    assert est.gain == pytest.approx(1.875, rel=0.005)
    assert est.verify_bound == "memory"


def test_a_compute_bound_step_gains_tokens_over_cost_ratio():
    """A huge batch at context 1: every step is its matmuls, so verify costs k+1 decode steps (ngram:
    gain -> E/(k+1)) and an MTP draft step one layer, eh_proj (2h x h) and the head over the whole model's
    matmuls (gain -> E / (k+1 + k x that ratio))."""
    shape = llama()
    batch, k, e = 1 << 16, 3, 1.875
    ngram = speculative_gain(shape, "h200", batch, k, 0.5, context=1, draft="ngram")
    assert ngram.verify_bound == "compute"
    assert ngram.gain == pytest.approx(e / (k + 1), rel=0.01)
    p, h = count_params(shape), shape.hidden_size
    layer = (p.total - p.embedding - p.lm_head - h) / shape.num_layers
    ratio = (layer + 2 * h * h + p.lm_head) / (p.total - p.embedding)  # draft step / decode step, in FLOPs
    mtp = speculative_gain(shape, "h200", batch, k, 0.5, context=1)
    assert mtp.draft_ms / (k * mtp.plain_step_ms) == pytest.approx(ratio, rel=0.02)
    assert mtp.gain == pytest.approx(e / (k + 1 + k * ratio), rel=0.01)


def test_the_mtp_draft_step_is_one_layer_like_the_last_with_eh_proj_and_the_head():
    shape = load_model_shape(DATA / "deepseek-v3.json")
    step = draft_step_costs(shape, 1, 512, weight_dtype="bf16")
    full = decode_costs(shape, 1, 512, weight_dtype="bf16").components
    h = shape.hidden_size
    assert step.components["mtp_proj"].flops == 2 * 2 * h * h + 2 * h * 4
    assert step.components["lm_head"].bytes == full["lm_head"].bytes
    # The last layer is an MoE layer: its attention is 1/61 of the model's, its experts those one token picks.
    assert step.components["attn_proj"].bytes == pytest.approx(full["attn_proj"].bytes / 61, rel=1e-9)
    assert step.components["dense_mlp"].bytes == 0 and step.components["routed_experts"].bytes > 0


def test_the_compute_bound_batch_falls_as_k_grows():
    """Short context, bf16 weights on an H200: the weights alone turn compute-bound at peak/bandwidth =
    989/4.8 = 206 tokens a step (activations, norms and the cache push plain decode a little past it);
    verification packs k+1 tokens per sequence, so it turns at about 1/(k+1) of plain decode's batch."""
    shape = llama()
    found = {k: crossover_batch(shape, "h200", k, 0.6, context=16, draft="ngram") for k in (1, 2, 3, 7)}
    plain = found[1].plain_compute_bound_batch
    assert 206 <= plain <= 250
    batches = [found[k].compute_bound_batch for k in (1, 2, 3, 7)]
    assert batches == sorted(batches, reverse=True) and len(set(batches)) == 4
    for k, cross in found.items():
        assert cross.plain_compute_bound_batch == plain
        assert (k + 1) * cross.compute_bound_batch == pytest.approx(plain, rel=0.05)
    # ...and speculation stops paying at smaller batches too: more of each step is wasted verification.
    ends = [found[k].break_even_batch for k in (1, 2, 3, 7)]
    assert ends == sorted(ends, reverse=True) and len(set(ends)) == 4
    for cross in found.values():
        assert cross.first_paying_batch == 1 and cross.break_even_batch > cross.compute_bound_batch


def test_the_crossover_batches_are_the_first_where_each_holds():
    shape = llama()
    cross = crossover_batch(shape, "h200", 3, 0.6, context=16, draft="ngram")
    gain = lambda b: speculative_gain(shape, "h200", b, 3, 0.6, context=16, draft="ngram").gain  # noqa: E731
    assert gain(cross.break_even_batch) <= 1.0 < gain(cross.break_even_batch - 1)
    verify = speculative_gain(shape, "h200", cross.compute_bound_batch, 3, 0.6, context=16, draft="ngram")
    before = speculative_gain(shape, "h200", cross.compute_bound_batch - 1, 3, 0.6, context=16, draft="ngram")
    assert verify.verify_bound == "compute" and before.verify_bound == "memory"


def test_an_moe_verify_step_reads_more_experts_so_a_small_batch_may_not_pay():
    """The small preset (32 experts, top-4): one token reads 4 experts a layer, a verify step's 4 tokens
    about 32 (1 - (7/8)^4) = 13.2, so at batch 1 verification costs much more than a decode step, while
    at batch 64 both read nearly every expert."""
    from rooftop.engine.model.config import ModelConfig

    shape = shape_from_config(ModelConfig.preset("small").to_dict(), "small")
    one = speculative_gain(shape, "h200", 1, 3, 0.5, context=512)
    wide = speculative_gain(shape, "h200", 64, 3, 0.5, context=512)
    assert one.verify_step_ms / one.plain_step_ms > 1.5 and wide.verify_step_ms / wide.plain_step_ms < 1.2
    assert one.gain < 1 < wide.gain
    cross = crossover_batch(shape, "h200", 3, 0.5, context=512)
    assert 1 < cross.first_paying_batch <= 8 and cross.break_even_batch > 64


def test_first_batch_doubles_then_bisects():
    assert first_batch(lambda b: b >= 37, 100) == 37
    assert first_batch(lambda b: b >= 1, 100) == 1
    assert first_batch(lambda b: b >= 100, 100) == 100  # max_batch need not be a power of two
    assert first_batch(lambda b: b > 100, 100) is None


def test_report_notes_what_the_draft_assumed():
    shape = llama()
    ngram = speculative_report(shape, "h200", [1, 8], 3, 0.5, context=128, draft="ngram")
    assert [e.batch for e in ngram.levels] == [1, 8] and ngram.expected_tokens == 1.875
    assert any("no device time" in n for n in ngram.notes)
    mtp = speculative_report(shape, "h200", [1], 3, (0.8, 0.6, 0.4), context=128)
    assert any("no num_nextn_predict_layers" in n for n in mtp.notes)
    deepseek = load_model_shape(DATA / "deepseek-v3.json")
    assert deepseek.mtp_layers == 1
    notes = speculative_report(deepseek, "h200", [1], 3, 0.7, context=128, tp=8).notes
    assert any("the layer runs 3 times" in n for n in notes)
    dsa = load_model_shape(DATA / "deepseek-v3.2.json")
    assert any(n.startswith("DSA") for n in speculative_report(dsa, "h200", [1], 3, 0.7, context=4096, tp=8).notes)
    assert not any(n.startswith("DSA") for n in speculative_report(dsa, "h200", [1], 3, 0.7, context=2048, tp=8).notes)
