"""CUDA graphs of the decode step at a set of batch sizes, replayed with static input buffers.

A graph is captured per batch size with every input in a fixed buffer: input_ids, positions,
seq_lens, block_tables padded to `max_pages` columns and slot_mapping. A smaller batch runs in the
next larger graph; its padding rows are one-token sequences whose only block is `dummy_block`,
so they write and read one slot no real sequence owns. Block tables are padded to `max_pages`
(known on the host, so the step never syncs): under the `actual` bound the Triton indexer's work
still follows the real seq_lens read on the device; under `capacity` the torch fallback scores all
`max_pages` pages, as public engines' graph-safe fallbacks do. Needs the model to call the kernels
through `kernels.dispatch` (the reference MoE syncs and cannot be captured).
"""

import torch
from torch import nn

from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.batch import ForwardBatch


class DecodeGraphs:
    """`DecodeGraphs(model, cache, batch_sizes, max_pages).run(batch) -> logits [B, vocab] float32`.

    `dummy_block` (default: the cache's last block) must never be given to a sequence.
    """

    def __init__(
        self,
        model: nn.Module,
        cache: KVCache,
        batch_sizes: list[int],
        max_pages: int,
        dummy_block: int | None = None,
        indexer_bound: str = "actual",
    ):
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError("batch_sizes must be positive")
        self.model, self.cache = model, cache
        self.batch_sizes = sorted(set(batch_sizes))
        self.max_pages = max_pages
        self.indexer_bound = indexer_bound
        self.block_size = cache.block_size
        self.dummy_block = cache.num_blocks - 1 if dummy_block is None else dummy_block
        self.dummy_slot = self.dummy_block * self.block_size
        device = cache.device
        n = self.batch_sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.slot_mapping = torch.full((n,), self.dummy_slot, dtype=torch.long, device=device)
        self.block_tables = torch.full((n, max_pages), -1, dtype=torch.int32, device=device)
        self.block_tables[:, 0] = self.dummy_block
        self.cu_query_lens = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self._capture_all()

    def _static_batch(self, size: int) -> ForwardBatch:
        return ForwardBatch(
            is_prefill=False,
            input_ids=self.input_ids[:size],
            positions=self.positions[:size],
            cu_query_lens=self.cu_query_lens[: size + 1],
            query_lens=[1] * size,
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size],
            slot_mapping=self.slot_mapping[:size],
            capacity_tokens=self.max_pages * self.block_size,
            indexer_bound=self.indexer_bound,
        )

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        # Largest first, so the smaller graphs reuse its memory from the shared pool.
        for size in reversed(self.batch_sizes):
            batch = self._static_batch(size)
            with torch.cuda.stream(stream):  # warm-up: compiles Triton kernels, settles the allocator
                self.model(batch, self.cache)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[size] = self.model(batch, self.cache)
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def graph_size(self, num_seqs: int) -> int | None:
        """The captured batch size a batch of `num_seqs` runs in, or None if it is larger than all."""
        return next((s for s in self.batch_sizes if s >= num_seqs), None)

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits [B, vocab] of a decode batch by graph replay (eager forward for prefill or oversize)."""
        size = self.graph_size(batch.num_seqs) if not batch.is_prefill else None
        if size is None:
            return self.model(batch, self.cache)
        n = batch.num_seqs
        cols = min(batch.block_tables.shape[1], self.max_pages)
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.seq_lens[:n].copy_(batch.seq_lens)
        self.slot_mapping[:n].copy_(batch.slot_mapping)
        self.block_tables[:n, :cols].copy_(batch.block_tables[:, :cols])
        self.block_tables[:n, cols:].fill_(-1)
        if n < size:  # padding rows: one token at position 0 in the dummy block
            self.input_ids[n:size].zero_()
            self.positions[n:size].zero_()
            self.seq_lens[n:size].fill_(1)
            self.slot_mapping[n:size].fill_(self.dummy_slot)
            self.block_tables[n:size].fill_(-1)
            self.block_tables[n:size, 0] = self.dummy_block
        self.graphs[size].replay()
        return self.logits[size][:n]
