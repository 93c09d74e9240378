"""Next-token choice from the last logits: greedy, temperature, top-p, per-request seeds, top logprobs."""

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(slots=True)
class SampleOutput:
    """Per row: the chosen token, its logprob, and the top-N (ids, logprobs) when asked for."""

    token_ids: list[int]
    logprobs: list[float]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]


class Sampler(nn.Module):
    """Picks one token per row of logits [B, vocab]; a module so that a profile can name its time."""

    def forward(
        self,
        logits: torch.Tensor,
        temperatures: list[float],
        top_ps: list[float],
        generators: list[torch.Generator | None],
        banned_ids: list[list[int]] | None = None,
        num_top_logprobs: int = 0,
    ) -> SampleOutput:
        """temperature 0 = greedy; a row's generator (None = the global one) makes its draws reproducible."""
        logits = logits.float()
        if banned_ids is not None and any(banned_ids):
            logits = ban_ids(logits, banned_ids)
        # logprobs as the model gives them (before temperature and top-p), like OpenAI and vLLM
        logprobs_all = torch.log_softmax(logits, dim=-1)
        token_ids = logits.argmax(dim=-1)
        # unseeded rows draw together in one call; a seeded row draws alone from its own generator
        batched = [r for r, t in enumerate(temperatures) if t > 0 and generators[r] is None]
        if batched:
            rows = torch.tensor(batched, device=logits.device)
            temps = torch.tensor([temperatures[r] for r in batched], device=logits.device)
            tops = torch.tensor([top_ps[r] for r in batched], device=logits.device)
            token_ids[rows] = _sample(logits[rows], temps, tops, None)
        for row, temperature in enumerate(temperatures):
            if temperature > 0 and generators[row] is not None:
                one = torch.tensor([temperature], device=logits.device)
                top = torch.tensor([top_ps[row]], device=logits.device)
                token_ids[row] = _sample(logits[row:row + 1], one, top, generators[row])[0]
        chosen = logprobs_all.gather(1, token_ids[:, None])[:, 0]
        out = SampleOutput(token_ids=token_ids.tolist(), logprobs=chosen.tolist(), top_ids=[], top_logprobs=[])
        if num_top_logprobs > 0:
            k = min(num_top_logprobs, logits.shape[-1])
            top = torch.topk(logprobs_all, k, dim=-1)
            out.top_ids = top.indices.tolist()
            out.top_logprobs = top.values.tolist()
        return out


def ban_ids(logits: torch.Tensor, banned_ids: list[list[int]]) -> torch.Tensor:
    """A copy of logits [B, vocab] with each row's banned ids at -inf.

    One index for all rows (one copy to the device, one kernel): a row at a time took 2.8 ms at
    batch 64 on an H200 (benchmarks/sampler_host.py), every decode step while min_tokens holds.
    """
    where = torch.tensor([[row, i] for row, ids in enumerate(banned_ids) for i in ids], device=logits.device)
    logits = logits.clone()
    logits[where[:, 0], where[:, 1]] = float("-inf")
    return logits


def _sample(logits: torch.Tensor, temperatures: torch.Tensor, top_ps: torch.Tensor,
            generator: torch.Generator | None) -> torch.Tensor:
    """Draw one id per row from softmax(logits / temperature) restricted to the row's top-p nucleus."""
    probs = torch.softmax(logits / temperatures[:, None], dim=-1)
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
    # keep the smallest prefix whose mass reaches top_p (the first token always stays)
    outside = (sorted_probs.cumsum(-1) - sorted_probs >= top_ps[:, None]) & (top_ps[:, None] < 1.0)
    outside[:, 0] = False  # even when top_p underflows float32 to 0
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    picks = torch.multinomial(sorted_probs, 1, generator=generator)
    return sorted_ids.gather(1, picks)[:, 0]


def make_generator(seed: int, device: torch.device) -> torch.Generator:
    """A generator on the logits' device, seeded for one request."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen
