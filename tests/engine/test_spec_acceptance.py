"""Speculation's pure parts: the rejection rule keeps the target distribution (a statistical test, fixed seed),
greedy acceptance is exact match, the target distribution is the sampler's, n-gram lookup proposes what
followed, and --speculative-config's mistakes each get one clear error."""

import pytest
import torch

from rooftop.engine.build import ServeConfig, check, spec_config
from rooftop.engine.model.config import ModelConfig
from rooftop.engine.sampler import Sampler
from rooftop.engine.spec.acceptance import accept_greedy, accept_sampled, target_probs
from rooftop.engine.spec.config import SpecConfig, parse_spec_config
from rooftop.engine.spec.ngram import propose_ngram

P = torch.tensor([0.10, 0.20, 0.30, 0.25, 0.15])  # the target's distribution over a 5-token vocabulary
Q = torch.tensor([0.40, 0.10, 0.10, 0.20, 0.20])  # the drafter's: far from P
DRAWS = 10_000
# a frequency's sd at 10,000 draws is at most 0.005: 0.02 is 4 sd; sampling from p (not p - q) after a rejection
# would put token 0 at 0.135, 0.035 off
TOLERANCE = 0.02


def frequencies(tokens: list[int]) -> torch.Tensor:
    return torch.bincount(torch.tensor(tokens), minlength=len(P)).double() / len(tokens)


def test_the_first_token_follows_p_whatever_q_proposes():
    gen = torch.Generator().manual_seed(0)
    probs, q = torch.stack([P, P]), Q[None, :]
    drafts = torch.multinomial(Q, DRAWS, replacement=True, generator=gen).tolist()
    firsts = [accept_sampled(probs, [d], q, gen)[0] for d in drafts]
    assert (frequencies(firsts) - P).abs().max() < TOLERANCE
    # how often a draft is kept: sum(min(p, q)) = 0.1 + 0.1 + 0.1 + 0.2 + 0.15
    kept = sum(f == d for f, d in zip(firsts, drafts, strict=True)) / DRAWS
    assert abs(kept - 0.65) < TOLERANCE


def test_a_point_mass_draft_keeps_p_and_accepts_with_p_of_the_draft():
    gen = torch.Generator().manual_seed(1)
    probs = torch.stack([P, P])
    outs = [accept_sampled(probs, [2], None, gen) for _ in range(DRAWS)]  # n-gram: always proposes 2
    assert (frequencies([o[0] for o in outs]) - P).abs().max() < TOLERANCE
    assert abs(sum(len(o) == 2 for o in outs) / DRAWS - P[2].item()) < TOLERANCE  # accepted: a bonus token follows
    bonus = [o[1] for o in outs if len(o) == 2]
    assert (frequencies(bonus) - P).abs().max() < 3 * TOLERANCE  # ~3,000 draws


def test_the_second_position_follows_its_own_target_after_an_accepted_first():
    p1 = torch.tensor([0.50, 0.05, 0.05, 0.30, 0.10])
    gen = torch.Generator().manual_seed(2)
    probs, q = torch.stack([P, p1, P]), torch.stack([Q, Q])
    seconds = []
    for _ in range(DRAWS):
        d = torch.multinomial(Q, 2, replacement=True, generator=gen).tolist()
        out = accept_sampled(probs, d, q, gen)
        assert len(out) <= 3 and out[:len(out) - 1] == d[:len(out) - 1]  # accepted drafts, then one more
        if len(out) >= 2:
            seconds.append(out[1])
    assert (frequencies(seconds) - p1).abs().max() < 2 * TOLERANCE  # ~6,500 draws


def test_greedy_keeps_the_matching_drafts_then_the_argmax():
    assert accept_greedy([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]  # all accepted: the bonus token
    assert accept_greedy([5, 6, 7, 8], [5, 9, 7]) == [5, 6]  # the second rejected: corrected, the rest dropped
    assert accept_greedy([5, 6], [4]) == [5]
    assert accept_greedy([3], []) == [3]


def test_target_probs_is_the_samplers_distribution():
    logits = torch.log(torch.tensor([[0.05, 0.5, 0.3, 0.1, 0.05]]))
    assert torch.allclose(target_probs(logits, 1.0, 1.0, 0), logits.softmax(-1))
    # top_k 2 keeps 0.5 and 0.3, renormalized; top_p 0.6 then keeps 0.625 alone
    assert torch.allclose(target_probs(logits, 1.0, 1.0, 2), torch.tensor([[0, 0.625, 0.375, 0, 0]]))
    assert torch.allclose(target_probs(logits, 1.0, 0.6, 2), torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0]]))
    # temperature 0.5 squares the probabilities before normalizing
    squared = torch.tensor([0.05, 0.5, 0.3, 0.1, 0.05]) ** 2
    assert torch.allclose(target_probs(logits, 0.5, 1.0, 0)[0], squared / squared.sum())
    # the sampler draws only inside the support target_probs gives
    gen = torch.Generator().manual_seed(0)
    seen = {Sampler()(logits, [1.0], [0.9], [gen], top_ks=[3]).result().token_ids[0] for _ in range(200)}
    support = set(torch.nonzero(target_probs(logits, 1.0, 0.9, 3)[0]).flatten().tolist())
    assert seen == support == {1, 2, 3}


def test_ngram_proposes_what_followed_the_longest_latest_match():
    assert propose_ngram([1, 2, 3, 4, 1, 2], 3, 1, 2) == [3, 4, 1]
    assert propose_ngram([1, 2, 3, 4, 1, 2], 9, 1, 2) == [3, 4, 1, 2]  # the rest of the sequence, no more
    # the longest suffix that matches wins over a later, shorter one: [7, 8] matched at 1 beats [8] at 5
    assert propose_ngram([0, 7, 8, 5, 6, 8, 9, 7, 8], 2, 1, 2) == [5, 6]
    # among equal lengths the latest occurrence
    assert propose_ngram([4, 1, 4, 2, 4], 1, 1, 1) == [2]
    assert propose_ngram([1, 2, 3], 3, 1, 2) == []  # no earlier occurrence
    assert propose_ngram([1, 2, 1, 2], 3, 3, 3) == []  # no 3-token match
    assert propose_ngram([1, 2, 1], 0, 1, 2) == []
    # ids past one byte: a byte pattern found across a token boundary is not a match
    assert propose_ngram([1, 256, 0, 7, 1], 2, 1, 1) == [256, 0]
    assert propose_ngram([256, 1, 0, 0, 1, 1], 2, 2, 2) == []


def test_spec_config_reads_vllms_json():
    assert parse_spec_config('{"method": "ngram", "num_speculative_tokens": 3}') == SpecConfig("ngram", 3, 5, 5)
    assert parse_spec_config('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}') \
        == SpecConfig("ngram", 2, 4, 4)
    assert parse_spec_config('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, '
                             '"prompt_lookup_max": 4}') == SpecConfig("ngram", 2, 2, 4)
    assert parse_spec_config('{"method": "deepseek_mtp", "num_speculative_tokens": 1}').method == "mtp"


@pytest.mark.parametrize("text, says", [
    ("{method: ngram}", "is not JSON"),
    ('["ngram"]', "must be a JSON object"),
    ('{"method": "eagle", "num_speculative_tokens": 2}', "method 'eagle' is not known"),
    ('{"num_speculative_tokens": 2}', "method None is not known"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "at least 1"),
    ('{"method": "ngram", "num_speculative_tokens": "3"}', "at least 1"),
    ('{"method": "ngram"}', "num_speculative_tokens must be"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "model": "x"}', "unknown key(s) model"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
     "swap them"),
    ('{"method": "mtp", "num_speculative_tokens": 2, "prompt_lookup_max": 2}', "drop them"),
])
def test_bad_spec_config_says_what_and_how_to_fix(text, says):
    with pytest.raises(ValueError, match="--speculative-config") as err:
        check(ServeConfig(speculative_config=text))
    assert says in str(err.value)


def test_spec_config_refusals_name_the_fix():
    mtp = '{"method": "mtp", "num_speculative_tokens": 1}'
    with pytest.raises(ValueError, match="no MTP module .* use method ngram"):
        spec_config(ServeConfig(speculative_config=mtp), ModelConfig(num_nextn_predict_layers=0))
    with pytest.raises(ValueError, match="prefill worker.*give the flag to the decode worker"):
        check(ServeConfig(speculative_config='{"method": "ngram", "num_speculative_tokens": 2}', role="prefill"))
    with pytest.raises(ValueError, match="decode worker.*use method ngram"):
        check(ServeConfig(speculative_config=mtp, role="decode"))
    # the presets carry an MTP module; ngram on a decode worker is served
    assert spec_config(ServeConfig(speculative_config=mtp, preset="small")).method == "mtp"
    check(ServeConfig(speculative_config='{"method": "ngram", "num_speculative_tokens": 2}', role="decode"))
