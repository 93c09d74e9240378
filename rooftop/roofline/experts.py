"""How many distinct experts a batch touches under uniform random top-k routing."""


def expected_distinct_experts(n_experts: int, top_k: int, n_tokens: float) -> float:
    """Expected distinct experts hit when n_tokens each pick top_k distinct experts uniformly at random.

    One token misses a given expert with probability C(E-1, k) / C(E, k) = 1 - k/E, tokens are
    independent, so E * (1 - (1 - k/E)^n) experts are hit on average (exact, not an approximation).
    """
    if n_experts <= 0 or top_k <= 0 or n_tokens <= 0:
        return 0.0
    if top_k >= n_experts:
        return float(n_experts)
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** n_tokens)
