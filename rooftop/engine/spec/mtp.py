"""The MTP drafter (DeepSeek-V3's multi-token prediction, vLLM's `mtp`): the model's first MTP module
proposes the token after next from the main model's hidden state and the next token, then runs on its own
output for the drafts after that (as vLLM reuses one module for k drafts).

Its KV rows live in cache layer `num_hidden_layers` and cover the same positions as the main model's: after
every step, `advance` runs the module over the positions the step computed and kept (position i takes the
model's hidden state at i and token i+1), which also gives the first draft of the next step. The chain
`propose` runs writes rows past them, which the next `advance` overwrites. A page taken from the prefix cache
holds the module's rows as the sequence that registered it computed them; its last row read that sequence's
next token, which a sequence going on differently does not share: a draft there may be worse, never the
output, which verification decides. Eager on every device (a prefill-shaped step and k-1 one-token steps
of one layer).
"""

from dataclasses import dataclass

import torch

from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.batch import build_batch, host_to_device
from rooftop.engine.model.model import DSAModel
from rooftop.engine.model_runner import RunnerConfig
from rooftop.engine.sequence import Sequence


@dataclass(slots=True)
class _Next:
    """What the drafter holds for a sequence between steps."""

    seq: Sequence
    num_cached_tokens: int  # the sequence's cached tokens when this was made: stale once they differ
    first: int  # the first draft of its next step
    state: torch.Tensor  # [hidden] the module's final-normed state at its last cached position


class MTPDrafter:
    """Greedy drafts from MTP module 0 (argmax: a point mass for the acceptance rule, as vLLM's)."""

    def __init__(self, model: DSAModel, cache: KVCache, config: RunnerConfig, device: torch.device):
        if not model.mtp:
            raise ValueError("the model has no MTP module (num_nextn_predict_layers 0)")
        if len(cache.latent) <= model.config.num_hidden_layers:
            raise ValueError("the KV cache has no layer for the MTP module: build it with num_layers "
                             f"{model.config.num_hidden_layers + 1}")
        self.model, self.cache, self.config, self.device = model, cache, config, device
        self._next: dict[int, _Next] = {}

    def held(self, seq_id: int) -> tuple[int, int, torch.Tensor] | None:
        """(cached tokens then, first draft, module state) held for a sequence since its last step, or None;
        kept until the next `propose` after it finished."""
        n = self._next.get(seq_id)
        return None if n is None else (n.num_cached_tokens, n.first, n.state)

    def propose(self, seqs: list[Sequence], counts: list[int]) -> list[list[int]]:
        """Up to counts[i] drafts for each of seqs (decoding, their last token not cached): the first from the
        last `advance`, each next one by the module over the draft before it."""
        self._next = {sid: n for sid, n in self._next.items() if not n.seq.is_finished}
        drafts: list[list[int]] = [[] for _ in seqs]
        states: dict[int, torch.Tensor] = {}
        for i, (seq, count) in enumerate(zip(seqs, counts, strict=True)):
            held = self._next.get(seq.seq_id)
            if count and held is not None and held.num_cached_tokens == seq.num_cached_tokens:
                drafts[i].append(held.first)
                states[i] = held.state
        step = 1
        while True:
            active = [i for i in states if counts[i] > step]
            if not active:
                return drafts
            # draft `step` of each stands at position num_cached + step - 1, after the rows written so far
            batch = build_batch([[drafts[i][-1]] for i in active],
                                [seqs[i].num_cached_tokens + step - 1 for i in active],
                                [seqs[i].block_table for i in active], self.config.block_size,
                                self.config.capacity_tokens, self.config.indexer_bound, self.device)
            batch.return_hidden = True
            logits, hidden = self.model.mtp_forward(batch, self.cache, torch.stack([states[i] for i in active]))
            for j, (i, token) in enumerate(zip(active, logits.argmax(dim=-1).tolist(), strict=True)):
                drafts[i].append(token)
                states[i] = hidden[j]
            states = {i: states[i] for i in active}
            step += 1

    def advance(self, seqs: list[Sequence], num_kept: list[int], next_tokens: list[list[int]],
                hidden: torch.Tensor, starts: list[int]) -> None:
        """Run the module over the positions this step computed and kept: seq i's num_kept[i] from its
        num_cached_tokens (not yet moved on), whose following tokens are next_tokens[i] and whose model
        states are hidden [tokens, hidden] from row starts[i]; hold each sequence's next first draft."""
        rows = [starts[i] + r for i, n in enumerate(num_kept) for r in range(n)]
        batch = build_batch(next_tokens, [s.num_cached_tokens for s in seqs], [s.block_table for s in seqs],
                            self.config.block_size, self.config.capacity_tokens, self.config.indexer_bound,
                            self.device)
        batch.return_hidden = True
        logits, states = self.model.mtp_forward(batch, self.cache, hidden[host_to_device(rows, torch.long,
                                                                                        self.device)])
        last = batch.cu_query_lens[1:].long() - 1
        for seq, kept, first, state in zip(seqs, num_kept, logits.argmax(dim=-1).tolist(), states[last],
                                           strict=True):
            self._next[seq.seq_id] = _Next(seq, seq.num_cached_tokens + kept, first, state)
