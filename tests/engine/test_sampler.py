"""Sampler: greedy is argmax, seeds reproduce, top-p keeps the nucleus, banned ids never come."""

import math

import torch

from rooftop.engine.sampler import SampleOutput, Sampler, ban_ids, make_generator


def sample(*args, **kwargs) -> SampleOutput:
    """The sampler's picks, read back to the host."""
    return Sampler()(*args, **kwargs).result()


def logits_rows(b: int, v: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_rows_are_argmax_and_logprobs_are_log_softmax():
    x = logits_rows(4)
    out = sample(x, [0.0] * 4, [1.0] * 4, [None] * 4, num_top_logprobs=3)
    assert out.token_ids == x.argmax(-1).tolist()
    expect = torch.log_softmax(x, -1)
    for row in range(4):
        assert math.isclose(out.logprobs[row], expect[row, out.token_ids[row]].item(), rel_tol=1e-5)
        assert out.top_ids[row][0] == out.token_ids[row]
        assert out.top_ids[row] == expect[row].topk(3).indices.tolist()
        assert out.top_logprobs[row] == sorted(out.top_logprobs[row], reverse=True)


def test_same_seed_same_tokens_other_seed_other_tokens():
    x = logits_rows(1).repeat(1, 1) / 10  # flat-ish: many tokens are likely

    def draw(seed: int) -> list[int]:
        gen = make_generator(seed, torch.device("cpu"))
        return [sample(x, [1.0], [1.0], [gen]).token_ids[0] for _ in range(20)]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_top_p_draws_only_from_the_nucleus():
    # probabilities 0.5, 0.3, 0.1, 0.1 (at temperature 1): top_p 0.7 keeps ids 0 and 1 only
    x = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.1]]))
    gen = make_generator(0, torch.device("cpu"))
    seen = {sample(x, [1.0], [0.7], [gen]).token_ids[0] for _ in range(200)}
    assert seen == {0, 1}
    seen_all = {sample(x, [1.0], [1.0], [gen]).token_ids[0] for _ in range(400)}
    assert seen_all == {0, 1, 2, 3}


def test_sampled_frequencies_follow_temperature():
    x = torch.log(torch.tensor([[0.8, 0.2]]))
    gen = make_generator(1, torch.device("cpu"))
    n = 2000
    ones = sum(sample(x, [1.0], [1.0], [gen]).token_ids[0] for _ in range(n)) / n
    assert abs(ones - 0.2) < 0.04  # binomial sd ~0.009
    # temperature 2 flattens: p(1) = sqrt(.2) / (sqrt(.8) + sqrt(.2)) = 1/3
    ones_hot = sum(sample(x, [2.0], [1.0], [gen]).token_ids[0] for _ in range(n)) / n
    assert abs(ones_hot - 1 / 3) < 0.05


def test_banned_ids_are_never_picked_even_when_best():
    x = logits_rows(3)
    best = x.argmax(-1).tolist()
    out = sample(x, [0.0, 0.0, 0.0], [1.0] * 3, [None] * 3, banned_ids=[[best[0]], [], [best[2]]])
    assert out.token_ids[0] != best[0] and out.token_ids[1] == best[1] and out.token_ids[2] != best[2]


def test_a_ban_every_row_shares_gives_the_rows_own_bans_result():
    """Every row banning the same ids (a batch under min_tokens) takes the shared-columns path; the
    logits are those the per-row index gives."""
    x = logits_rows(4)
    best = x.argmax(-1).tolist()
    shared = ban_ids(x, [[best[0], 7]] * 4)
    per_row = ban_ids(torch.cat([x, x[:1]]), [[best[0], 7]] * 4 + [[]])[:4]  # a row without bans: per row
    assert torch.equal(shared, per_row) and torch.isinf(shared[:, [best[0], 7]]).all()
    assert torch.isfinite(x).all()  # the caller's logits are left alone
    out = sample(x, [0.0] * 4, [1.0] * 4, [None] * 4, banned_ids=[[best[0]]] * 4)
    assert best[0] not in out.token_ids


def test_mixed_batch_keeps_greedy_rows_greedy():
    x = logits_rows(3, seed=5)
    gen = make_generator(3, torch.device("cpu"))
    out = sample(x, [0.0, 1.0, 0.0], [1.0, 0.9, 1.0], [None, gen, None])
    assert out.token_ids[0] == x[0].argmax().item() and out.token_ids[2] == x[2].argmax().item()


def test_unseeded_rows_draw_in_one_batch_within_each_nucleus():
    x = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.1]])).repeat(300, 1)
    out = sample(x, [1.0] * 300, [0.7] * 150 + [1.0] * 150, [None] * 300)
    assert set(out.token_ids[:150]) == {0, 1} and set(out.token_ids[150:]) == {0, 1, 2, 3}


def test_top_p_too_small_for_float32_keeps_the_best_token():
    x = logits_rows(2, seed=9)
    gen = make_generator(0, torch.device("cpu"))
    out = sample(x, [1.0, 1.0], [1e-300, 1e-300], [None, gen])
    assert out.token_ids == x.argmax(-1).tolist()


def test_top_k_keeps_the_k_likeliest_then_top_p_applies_to_them_renormalized():
    # probabilities 0.5, 0.3, 0.2: top_k 2 keeps ids 0 and 1
    x = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    gen = make_generator(0, torch.device("cpu"))
    seen = {sample(x, [1.0], [1.0], [gen], top_ks=[2]).token_ids[0] for _ in range(300)}
    assert seen == {0, 1}
    # top_p 0.6 on those two renormalized (0.625, 0.375) keeps id 0 alone; on all three it would keep 0 and 1
    seen = {sample(x, [1.0], [0.6], [gen], top_ks=[2]).token_ids[0] for _ in range(300)}
    assert seen == {0}
    assert {sample(x, [1.0], [0.6], [gen]).token_ids[0] for _ in range(300)} == {0, 1}


def test_top_k_per_row_in_one_batch_and_zero_or_minus_one_is_all():
    x = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]])).repeat(400, 1)
    out = sample(x, [1.0] * 400, [1.0] * 400, [None] * 400, top_ks=[1] * 100 + [3] * 100 + [0] * 100 + [-1] * 100)
    assert set(out.token_ids[:100]) == {0} and set(out.token_ids[100:200]) == {0, 1, 2}
    assert set(out.token_ids[200:300]) == {0, 1, 2, 3} and set(out.token_ids[300:]) == {0, 1, 2, 3}
