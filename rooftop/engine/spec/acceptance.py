"""Which drafts a verify step keeps: exact match when greedy, the standard rejection rule when sampling
(Leviathan et al. 2023; Chen et al. 2023), so the output distribution is the target model's either way."""

import torch


def accept_greedy(target_ids: list[int], drafts: list[int]) -> list[int]:
    """The tokens a greedy step makes: the drafts that equal the target's argmax at their position, then the
    target's argmax after the last of them (a correction, or the bonus token when all k matched).
    target_ids: the argmax at each of the k+1 verified positions."""
    m = 0
    while m < len(drafts) and drafts[m] == target_ids[m]:
        m += 1
    return drafts[:m] + [target_ids[m]]


def accept_sampled(probs: torch.Tensor, drafts: list[int], draft_probs: torch.Tensor | None = None,
                   generator: torch.Generator | None = None) -> list[int]:
    """The tokens a sampled step makes, by the rejection rule: draft d_j is accepted with probability
    min(1, p_j(d_j) / q_j(d_j)); at the first rejection the token is drawn from normalize(max(0, p_j - q_j));
    when all k are accepted a bonus token is drawn from p_k.

    probs [k+1, vocab]: the target's distribution at each verified position (temperature, top-k and top-p
    applied). draft_probs [k, vocab]: the drafter's distributions; None for a drafter that proposes one
    token for sure (n-gram, or greedy MTP): q is a point mass, so d is accepted with probability p(d), and
    after a rejection the token is drawn from p without d. Draws come from `generator` (None: torch's)."""
    k = len(drafts)
    m = k
    if k:
        rows = torch.arange(k, device=probs.device)
        ids = torch.tensor(drafts, device=probs.device)
        p = probs[rows, ids]
        q = draft_probs[rows, ids] if draft_probs is not None else torch.ones_like(p)
        u = torch.rand(k, generator=generator, device=probs.device, dtype=p.dtype)
        rejected = (u * q >= p).tolist()  # u < p/q accepts; q > 0 for a token the drafter proposed
        m = rejected.index(True) if True in rejected else k
    if m == k:
        last = probs[k]
    else:
        q_m = draft_probs[m] if draft_probs is not None else torch.zeros_like(probs[m]).index_fill_(
            0, torch.tensor([drafts[m]], device=probs.device), 1.0)
        last = (probs[m] - q_m).clamp_(min=0)
        if not last.sum() > 0:  # p == q exactly: a rejection had probability 0; draw from p
            last = probs[m]
    token = int(torch.multinomial(last, 1, generator=generator))
    return drafts[:m] + [token]


def target_probs(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """The distribution the sampler draws from, per row of logits [R, vocab]: softmax(logits / temperature)
    within the top_k likeliest tokens (0 or -1: all), then within the top_p nucleus, renormalized (the
    sampler's rules, sampler._sample, in vocabulary order)."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
    vocab = probs.shape[-1]
    if 0 < top_k < vocab:
        sorted_probs[:, top_k:] = 0.0
        sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    if top_p < 1.0:
        outside = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        outside[:, 0] = False
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(1, sorted_ids, sorted_probs)
