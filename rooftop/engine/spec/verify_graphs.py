"""CUDA graphs of the verify step: the prefill graphs (cuda_graphs.PrefillGraphs), captured returning the
logits of the rows a batch names and every token's hidden state."""

import torch
from torch import nn

from rooftop.engine.cuda_graphs import PrefillGraphs, StartMark, mark_start
from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.batch import ForwardBatch


class VerifyGraphs(PrefillGraphs):
    """`run(batch) -> (logits [len(batch.logit_rows), vocab], hidden [tokens, hidden])` by replay of the
    smallest prefill-shaped graph that holds the batch (as PrefillGraphs picks it), else eagerly.

    Each graph computes the head over as many rows as it has tokens (the rows it is not given point at
    token 0): at the verify step's sizes, a few thousand more multiply-adds per row than the plain prefill
    graph, which computes the head of each sequence's last token only."""

    def __init__(self, model: nn.Module, cache: KVCache, token_sizes: list[int], max_seqs: int, max_pages: int,
                 dummy_block: int | None = None):
        self.logit_rows = torch.zeros(max(token_sizes), dtype=torch.long, device=cache.device)
        super().__init__(model, cache, token_sizes, max_seqs, max_pages, dummy_block)

    def _static_batch(self, tokens: int) -> ForwardBatch:
        batch = super()._static_batch(tokens)
        batch.logit_rows = self.logit_rows[:tokens]
        batch.return_hidden = True
        return batch

    @torch.inference_mode()
    def run(self, batch: ForwardBatch, start: StartMark | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.graph_tokens(batch)
        if tokens is None:
            mark_start(start)
            return self.model(batch, self.cache)
        n, t, r = batch.num_seqs, batch.input_ids.shape[0], batch.logit_rows.shape[0]
        self._copy_in(batch)
        self.cu_query_lens[: n + 1].copy_(batch.cu_query_lens)
        self._fill_padding(n, t, tokens)
        self.logit_rows[:r].copy_(batch.logit_rows)
        self.logit_rows[r:tokens].zero_()
        mark_start(start)
        self.graphs[tokens].replay()
        logits, hidden = self.logits[tokens]
        return logits[:r], hidden[:t]
