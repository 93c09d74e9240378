"""Next-token choice from the last logits: greedy, temperature, top-k, top-p, per-request seeds, top logprobs."""

import functools
from dataclasses import dataclass

import torch
from torch import nn

from rooftop.engine.model.batch import host_to_device


@dataclass(slots=True)
class SampleOutput:
    """Per row: the chosen token, its logprob, and the top-N (ids, logprobs) when asked for."""

    token_ids: list[int]
    logprobs: list[float]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]


class PendingSample:
    """One step's picks: on the device at once (the next step's inputs gather from `token_ids` there),
    on the host when `result()` is called. The copies to the host are queued behind the sampling, so
    the host can launch the next step before it waits for these."""

    def __init__(self, token_ids: torch.Tensor, logprobs: torch.Tensor, top: tuple[torch.Tensor, torch.Tensor] | None,
                 stream: torch.cuda.Stream | None = None):
        """stream: the current CUDA stream, where the caller has it (else it is asked for)."""
        self.token_ids = token_ids
        self._host = [_to_host(t) for t in (token_ids, logprobs, *(top or ()))]
        self._done = torch.cuda.Event() if token_ids.is_cuda else None
        if self._done is not None:
            self._done.record(stream)

    def result(self) -> SampleOutput:
        """The picks as lists; waits for the device to finish the step."""
        if self._done is not None:
            self._done.synchronize()
        ids, logprobs, *top = (t.tolist() for t in self._host)
        return SampleOutput(ids, logprobs, *(top or ([], [])))


def _to_host(t: torch.Tensor) -> torch.Tensor:
    if not t.is_cuda:
        return t
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)


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
        top_ks: list[int] | None = None,
        stream: torch.cuda.Stream | None = None,
    ) -> PendingSample:
        """temperature 0 = greedy; top_k 0 (or -1) = all tokens; a row's generator (None = the global one) makes
        its draws reproducible. stream: the current CUDA stream where the caller has it (host time)."""
        logits = logits.float()
        if banned_ids is not None and any(banned_ids):
            logits = ban_ids(logits, banned_ids)
        # logprobs as the model gives them (before temperature and top-p), like OpenAI and vLLM
        logprobs_all = torch.log_softmax(logits, dim=-1)
        token_ids = logits.argmax(dim=-1)
        # unseeded rows draw together in one call; a seeded row draws alone from its own generator
        vocab = logits.shape[-1]
        # k as a count of sorted ranks to keep; None when no row limits it (no mask to build)
        ks = [k if 0 < k < vocab else vocab for k in top_ks] if top_ks and any(0 < k < vocab for k in top_ks) \
            else None
        batched = [r for r, t in enumerate(temperatures) if t > 0 and generators[r] is None]
        if batched:
            rows = host_to_device(batched, torch.long, logits.device)
            temps = host_to_device([temperatures[r] for r in batched], torch.float32, logits.device)
            tops = host_to_device([top_ps[r] for r in batched], torch.float32, logits.device)
            kept = host_to_device([ks[r] for r in batched], torch.long, logits.device) if ks else None
            token_ids[rows] = _sample(logits[rows], temps, tops, None, kept)
        for row, temperature in enumerate(temperatures):
            if temperature > 0 and generators[row] is not None:
                one = host_to_device([temperature], torch.float32, logits.device)
                top = host_to_device([top_ps[row]], torch.float32, logits.device)
                kept = host_to_device([ks[row]], torch.long, logits.device) if ks else None
                token_ids[row] = _sample(logits[row:row + 1], one, top, generators[row], kept)[0]
        chosen = logprobs_all.gather(1, token_ids[:, None])[:, 0]
        top = None
        if num_top_logprobs > 0:
            k = min(num_top_logprobs, logits.shape[-1])
            values, indices = torch.topk(logprobs_all, k, dim=-1)
            top = (indices, values)
        return PendingSample(token_ids, chosen, top, stream)


def ban_ids(logits: torch.Tensor, banned_ids: list[list[int]]) -> torch.Tensor:
    """A copy of logits [B, vocab] with each row's banned ids at -inf.

    One index for all rows (one copy to the device, one kernel): a row at a time took 2.8 ms at
    batch 64 on an H200 (benchmarks/sampler_host.py), every decode step while min_tokens holds.
    Where every row bans the same ids (a batch under min_tokens: <eos> and its stop tokens), those
    columns, from a device index kept per set of ids: no copy to the device a step, one torch call.
    """
    first = banned_ids[0]
    if first and all(ids == first for ids in banned_ids):
        return logits.index_fill(1, _column_index(tuple(first), logits.device), float("-inf"))
    where = host_to_device([[row, i] for row, ids in enumerate(banned_ids) for i in ids], torch.long, logits.device)
    logits = logits.clone()
    # the value as a device tensor: a Python float would be copied to the device synchronously
    logits.index_put_((where[:, 0], where[:, 1]), logits.new_full((where.shape[0],), float("-inf")))
    return logits


@functools.lru_cache(maxsize=64)
def _column_index(ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """ids as a LongTensor on device, made once per set of ids (a request's <eos> and stop tokens)."""
    return host_to_device(list(ids), torch.long, device)


def _sample(logits: torch.Tensor, temperatures: torch.Tensor, top_ps: torch.Tensor,
            generator: torch.Generator | None, top_ks: torch.Tensor | None = None) -> torch.Tensor:
    """Draw one id per row from softmax(logits / temperature) restricted to the row's top-k tokens, then to
    the top-p nucleus of those (renormalized), as vLLM applies them."""
    probs = torch.softmax(logits / temperatures[:, None], dim=-1)
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
    if top_ks is not None:
        ranks = torch.arange(sorted_probs.shape[-1], device=sorted_probs.device)
        sorted_probs = sorted_probs.masked_fill(ranks[None, :] >= top_ks[:, None], 0.0)
        sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
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
