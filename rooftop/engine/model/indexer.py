"""DSA lightning indexer: picks, for each query, the top-k cached positions it will attend to."""

import torch
from torch import nn

from rooftop.engine.kernels import dispatch as kernels
from rooftop.engine.kernels import reference
from rooftop.engine.kernels.reference import CachedRows
from rooftop.engine.model.batch import ForwardBatch, StepTensors, capacity_pages
from rooftop.engine.model.config import ModelConfig
from rooftop.engine.model.layers import Linear, RMSNorm


class Indexer(nn.Module):
    """score(t) = sum_h w_h * ReLU(q_h . k_t); q from the q-LoRA latent, one shared key per token."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.n_heads, self.head_dim, self.topk = c.index_n_heads, c.index_head_dim, c.index_topk
        self.wq_b = Linear(c.q_lora_rank, c.index_n_heads * c.index_head_dim)
        self.wk = nn.Linear(c.hidden_size, c.index_head_dim, bias=False)
        self.k_norm = RMSNorm(c.index_head_dim, c.rms_norm_eps)
        self.weights_proj = nn.Linear(c.hidden_size, c.index_n_heads, bias=False)
        self.weight_scale = c.index_n_heads**-0.5 * c.index_head_dim**-0.5

    def query_heads(self, q_rows: torch.Tensor) -> torch.Tensor:
        """wq_b's output [T, heads * dim] as [T, heads, dim] (a view), for RoPE on each head's first dims."""
        return q_rows.view(q_rows.shape[0], self.n_heads, self.head_dim)

    def key_rows(self, k_rows: torch.Tensor, index_k_cache: torch.Tensor) -> CachedRows:
        """The cache write of the new tokens' keys k_rows = wk(x): normed, RoPE on their first dims."""
        return CachedRows(k_rows, self.k_norm.weight, self.k_norm.eps, self.head_dim, 0, index_k_cache)

    def forward(
        self,
        q: torch.Tensor,
        head_weights: torch.Tensor,
        batch: ForwardBatch,
        index_k_cache: torch.Tensor,
        step: StepTensors,
        as_slots: bool = False,
    ) -> torch.Tensor:
        """LongTensor[T, index_topk] positions (-1 = none) of the cached keys each new token scores
        highest, or with `as_slots` their flat cache slots (the Triton kernels write those directly).

        The caller projects and rotates: q [T, heads, dim] = RoPE on the first qk_rope_head_dim dims of
        wq_b(q latent) (`query_heads`), head_weights = weights_proj(x), and it has already written the
        new tokens' keys (`key_rows`), with attention's own rows in the same kernels. Decode picks may
        come in any order, but valid ones first (-1 after them).
        """
        num_tokens = q.shape[0]
        if batch.is_prefill:
            # Prefill scores the actual length whatever the bound (public engines' prefill does too).
            # The Triton path reads every length on the device and needs only a bound on the pages
            # (the longest sequence, known on the host; a prefill graph's is its table width). The
            # reference loops over the host's lengths (asked of the device only where a batch lacks them).
            pages = batch.block_tables.shape[1]
            if batch.max_seq_len:
                pages = min(pages, capacity_pages(batch.max_seq_len, index_k_cache.shape[1]))
            seq_lens = batch.seq_lens if batch.seq_lens_host is None else batch.seq_lens_host
            return kernels.indexer_topk_prefill(
                q, head_weights, index_k_cache, batch.block_tables, seq_lens,
                batch.query_lens, batch.positions, self.topk, token_seq=step.token_seq, num_pages=pages,
                weight_scale=self.weight_scale, slots=as_slots,
            )
        if num_tokens != batch.num_seqs:
            raise ValueError(f"a decode batch has one new token per sequence, got {num_tokens} for {batch.num_seqs}")
        if batch.indexer_bound == "capacity":
            # The graph-safe torch fallback of public engines: fixed work sized by the configured
            # context, masked afterwards (FACTS.md). Kept in torch on every device on purpose.
            num_pages = capacity_pages(batch.capacity_tokens, index_k_cache.shape[1])
            picks = reference.indexer_topk_decode(
                q, head_weights * self.weight_scale, index_k_cache, batch.block_tables, batch.seq_lens, num_pages,
                self.topk,
            )
            if not as_slots:
                return picks
            return kernels.positions_to_slots(picks, step.token_seq, batch.block_tables, index_k_cache.shape[1])
        # Work that follows the sequences: the Triton kernel reads seq_lens on the device (the page
        # count only bounds its grid); the torch reference scores up to the batch's longest
        # sequence, known on the host. Neither asks the device for a length.
        pages = batch.block_tables.shape[1]
        if batch.max_seq_len:
            pages = min(pages, capacity_pages(batch.max_seq_len, index_k_cache.shape[1]))
        return kernels.indexer_topk_decode(
            q, head_weights, index_k_cache, batch.block_tables, batch.seq_lens, pages, self.topk, ordered=False,
            weight_scale=self.weight_scale, slots=as_slots,
        )
