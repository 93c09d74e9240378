"""The distinct-experts expectation against a simulation of uniform random top-k routing."""

import numpy as np
import pytest

from rooftop.roofline import expected_distinct_experts


def simulate(n_experts: int, top_k: int, n_tokens: int, trials: int, rng) -> np.ndarray:
    """Distinct experts hit per trial: each token takes the top_k of a random score per expert."""
    scores = rng.random((trials, n_tokens, n_experts))
    chosen = np.argpartition(scores, -top_k, axis=-1)[..., -top_k:]  # k distinct experts per token
    hit = np.zeros((trials, n_experts), dtype=bool)
    np.put_along_axis(hit, chosen.reshape(trials, -1), True, axis=1)
    return hit.sum(axis=1)


@pytest.mark.parametrize(
    "n_experts,top_k,n_tokens", [(8, 2, 1), (8, 2, 3), (64, 6, 8), (256, 8, 16), (128, 8, 64)]
)
def test_matches_monte_carlo(n_experts, top_k, n_tokens):
    rng = np.random.default_rng(n_experts * 1000 + n_tokens)
    counts = simulate(n_experts, top_k, n_tokens, 2000, rng)
    stderr = counts.std(ddof=1) / np.sqrt(len(counts)) + 1e-9
    expected = expected_distinct_experts(n_experts, top_k, n_tokens)
    assert abs(counts.mean() - expected) < 4 * stderr + 1e-6, (counts.mean(), expected)


def test_limits():
    assert expected_distinct_experts(256, 8, 0) == 0
    assert expected_distinct_experts(256, 8, 1) == pytest.approx(8)
    assert expected_distinct_experts(256, 8, 100_000) == pytest.approx(256)
    assert expected_distinct_experts(8, 8, 3) == 8
    # Far fewer than tokens x k once tokens collide: 16 tokens x 8 picks hit ~102 of 256.
    assert expected_distinct_experts(256, 8, 16) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 16))
    assert 100 < expected_distinct_experts(256, 8, 16) < 104
