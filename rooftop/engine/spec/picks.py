"""The tokens a verify step makes, from its logits: each sequence's drafts accepted or not, its next token,
and the logprobs a reply carries, with the sampler's rules (min_tokens bans, temperature, top-k, top-p)."""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rooftop.engine.model.batch import host_to_device
from rooftop.engine.model.config import EOS_ID
from rooftop.engine.model_runner import temperature
from rooftop.engine.sampler import ban_ids
from rooftop.engine.sequence import Sequence
from rooftop.engine.spec.acceptance import accept_greedy, accept_sampled, target_probs


@dataclass(slots=True)
class Picked:
    """A sequence's tokens from one verify step: its accepted drafts then one more."""

    token_ids: list[int]
    logprobs: list[float]
    tops: list[list[tuple[int, float]]]  # top-N (id, logprob) at each token's position, when asked for
    num_accepted: int  # drafts accepted


def pick(seqs: list[Sequence], drafts: list[list[int]], rows: list[list[int]], logits: torch.Tensor,
         generator: Callable[[Sequence], torch.Generator | None]) -> list[Picked | None]:
    """Each sequence's Picked (None where it has no rows: a prompt chunk short of the prompt's end).
    rows[i]: seq i's rows of logits, at its last scheduled token then at each of drafts[i]."""
    logits = logits.float()
    # min_tokens, as the sampler: <eos> and the stop tokens are barred while fewer tokens came before
    banned = [[] for _ in range(logits.shape[0])]
    for seq, seq_rows in zip(seqs, rows, strict=True):
        for j, r in enumerate(seq_rows):
            if seq.num_completion_tokens + j < seq.params.min_tokens:
                banned[r] = [EOS_ID, *seq.params.stop_token_ids]
    if any(banned):
        logits = ban_ids(logits, banned)
    logprobs_all = torch.log_softmax(logits, dim=-1)
    argmax = logits.argmax(dim=-1).tolist()
    out: list[list[int]] = []
    for seq, extra, seq_rows in zip(seqs, drafts, rows, strict=True):
        if not seq_rows:
            out.append([])
        elif temperature(seq) == 0:
            out.append(accept_greedy([argmax[r] for r in seq_rows], extra))
        else:
            p = seq.params
            index = host_to_device(seq_rows, torch.long, logits.device)
            probs = target_probs(logits[index], temperature(seq), p.top_p, p.top_k)
            out.append(accept_sampled(probs, extra, None, generator(seq)))
    # the chosen tokens' logprobs, and the top-N, in one read each
    where = [(seq_rows[j], t) for tokens, seq_rows in zip(out, rows, strict=True) for j, t in enumerate(tokens)]
    chosen = []
    if where:
        index = host_to_device([w for pair in where for w in pair], torch.long, logits.device).view(-1, 2)
        chosen = logprobs_all[index[:, 0], index[:, 1]].tolist()
    n_top = max((s.params.logprobs or 0) for s in seqs)
    top_ids = top_values = None
    if n_top and where:
        values, ids = torch.topk(logprobs_all, min(n_top, logprobs_all.shape[-1]), dim=-1)
        top_ids, top_values = ids.tolist(), values.tolist()
    picked: list[Picked | None] = []
    i = 0
    for seq, tokens, seq_rows in zip(seqs, out, rows, strict=True):
        if not seq_rows:
            picked.append(None)
            continue
        n = seq.params.logprobs or 0
        tops = [list(zip(top_ids[r][:n], top_values[r][:n], strict=True)) if n else [] for r in seq_rows[:len(tokens)]]
        picked.append(Picked(tokens, chosen[i:i + len(tokens)], tops, len(tokens) - 1))
        i += len(tokens)
    return picked
