"""CUDA graphs of the decode step at a set of batch sizes, and of the prefill step at a set of chunk
sizes, replayed with static input buffers.

A graph is captured per batch size with every input in a fixed buffer: input_ids, positions,
seq_lens, block_tables padded to `max_pages` columns and slot_mapping. A smaller batch runs in the
next larger graph; its padding rows are one-token sequences whose only block is `dummy_block`,
so they write and read one slot no real sequence owns. Block tables are padded to `max_pages`
(known on the host, so the step never syncs): under the `actual` bound the Triton indexer's work
still follows the real seq_lens read on the device; under `capacity` the torch fallback scores all
`max_pages` pages, as public engines' graph-safe fallbacks do. Needs the model to call the kernels
through `kernels.dispatch` (the reference MoE syncs and cannot be captured).

A prefill chunk of t tokens from n sequences runs in the smallest graph of at least t tokens (and
n + 1 rows): the tokens it does not fill belong to one padding sequence in `dummy_block`, at
position 0, and the rows past it are empty sequences. The Triton prefill indexer reads each token's
position on the device and scores only its own sequence's pages below it, so a graph captured with
`max_pages` columns does the work of the chunk at hand.
"""

from collections.abc import Callable

import torch
from torch import nn

from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.batch import ForwardBatch

# A timing event and the stream to record it on, marking where a step's forward starts on the device.
StartMark = tuple[torch.cuda.Event, torch.cuda.Stream]


def mark_start(start: StartMark | None) -> None:
    """Record `start` where the forward's own kernels begin: past the copy-in, whose host time (when
    the host is behind the GPU) would otherwise count as the forward's."""
    if start is not None:
        start[0].record(start[1])


@torch.inference_mode()
def _capture(model: nn.Module, cache: KVCache, sizes: list[int], static_batch: Callable[[int], ForwardBatch],
             ) -> tuple[dict[int, torch.cuda.CUDAGraph], dict[int, torch.Tensor]]:
    """A graph of model(static_batch(size), cache) per size, and the logits tensor each one fills."""
    graphs: dict[int, torch.cuda.CUDAGraph] = {}
    logits: dict[int, torch.Tensor] = {}
    pool = torch.cuda.graph_pool_handle()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    for size in sorted(sizes, reverse=True):  # largest first: the smaller graphs reuse its memory from the pool
        batch = static_batch(size)
        with torch.cuda.stream(stream):  # warm-up: compiles Triton kernels, settles the allocator
            model(batch, cache)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            logits[size] = model(batch, cache)
        graphs[size] = graph
    torch.cuda.synchronize()
    return graphs, logits


class _StaticInputs:
    """The input buffers a graph reads, sized for `tokens` new tokens of `rows` sequences, and their
    padding: a padding sequence writes and reads only `dummy_block`, at position 0."""

    def __init__(self, cache: KVCache, tokens: int, rows: int, max_pages: int, dummy_block: int | None):
        self.max_pages = max_pages
        self.block_size = cache.block_size
        self.dummy_block = cache.num_blocks - 1 if dummy_block is None else dummy_block
        self.dummy_slot = self.dummy_block * self.block_size
        device = cache.device
        self.input_ids = torch.zeros(tokens, dtype=torch.long, device=device)
        self.positions = torch.zeros(tokens, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((tokens,), self.dummy_slot, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(rows, dtype=torch.int32, device=device)
        self.block_tables = torch.full((rows, max_pages), -1, dtype=torch.int32, device=device)
        self.block_tables[:, 0] = self.dummy_block

    def _copy_in(self, batch: ForwardBatch) -> None:
        """The batch's tokens and sequences into the first rows of the buffers."""
        n, t = batch.num_seqs, batch.input_ids.shape[0]
        cols = min(batch.block_tables.shape[1], self.max_pages)
        self.input_ids[:t].copy_(batch.input_ids)
        self.positions[:t].copy_(batch.positions)
        self.slot_mapping[:t].copy_(batch.slot_mapping)
        self.seq_lens[:n].copy_(batch.seq_lens)
        self.block_tables[:n, :cols].copy_(batch.block_tables[:, :cols])
        self.block_tables[:n, cols:].fill_(-1)

    def _pad(self, n: int, t: int, rows: int, tokens: int) -> None:
        """Sequences n..rows and tokens t..tokens as padding: in the dummy block, at position 0."""
        self.input_ids[t:tokens].zero_()
        self.positions[t:tokens].zero_()
        self.slot_mapping[t:tokens].fill_(self.dummy_slot)
        self.seq_lens[n:rows].fill_(1)
        self.block_tables[n:rows].fill_(-1)
        self.block_tables[n:rows, 0] = self.dummy_block


class DecodeGraphs(_StaticInputs):
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
        self.indexer_bound = indexer_bound
        n = self.batch_sizes[-1]
        super().__init__(cache, n, n, max_pages, dummy_block)
        self.cu_query_lens = torch.arange(n + 1, dtype=torch.int32, device=cache.device)
        self.graphs, self.logits = _capture(model, cache, self.batch_sizes, self._static_batch)

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

    def graph_size(self, num_seqs: int) -> int | None:
        """The captured batch size a batch of `num_seqs` runs in, or None if it is larger than all."""
        return next((s for s in self.batch_sizes if s >= num_seqs), None)

    @torch.inference_mode()
    def run(self, batch: ForwardBatch, start: StartMark | None = None) -> torch.Tensor:
        """Logits [B, vocab] of a decode batch by graph replay (eager forward for prefill or oversize).
        `start` (event, stream) is recorded just before the forward's kernels: after the copy-in."""
        size = self.graph_size(batch.num_seqs) if not batch.is_prefill else None
        if size is None:
            mark_start(start)
            return self.model(batch, self.cache)
        n = batch.num_seqs
        self._copy_in(batch)
        if n < size:  # padding rows: one token at position 0 in the dummy block
            self._pad(n, n, size, size)
        mark_start(start)
        self.graphs[size].replay()
        return self.logits[size][:n]


class PrefillGraphs(_StaticInputs):
    """`PrefillGraphs(model, cache, token_sizes, max_seqs, max_pages).run(batch) -> logits [B, vocab]`.

    Graphs of the prefill step at each of `token_sizes` tokens, with room for `max_seqs` sequences
    (and the padding one). `graph_tokens(batch)` says which graph a prefill batch runs in (None: none
    fits, and `run` takes the eager forward). `dummy_block` must never be given to a sequence.
    """

    def __init__(self, model: nn.Module, cache: KVCache, token_sizes: list[int], max_seqs: int, max_pages: int,
                 dummy_block: int | None = None):
        if not token_sizes or min(token_sizes) < 1 or max_seqs < 1:
            raise ValueError("token_sizes and max_seqs must be positive")
        self.model, self.cache = model, cache
        self.token_sizes = sorted(set(token_sizes))
        self.max_seqs = max_seqs
        tokens, rows = self.token_sizes[-1], self.rows(self.token_sizes[-1])
        super().__init__(cache, tokens, rows, max_pages, dummy_block)
        self.cu_query_lens = torch.zeros(rows + 1, dtype=torch.int32, device=cache.device)
        self.graphs, self.logits = _capture(model, cache, self.token_sizes, self._capture_batch)

    def rows(self, tokens: int) -> int:
        """Sequence rows of the graph of `tokens` tokens: as many sequences as could share them, at most
        max_seqs, and the padding sequence."""
        return min(tokens, self.max_seqs) + 1

    def _static_batch(self, tokens: int) -> ForwardBatch:
        rows = self.rows(tokens)
        return ForwardBatch(
            is_prefill=True,
            input_ids=self.input_ids[:tokens],
            positions=self.positions[:tokens],
            cu_query_lens=self.cu_query_lens[: rows + 1],
            query_lens=[0] * rows,  # only their count is read on the Triton path
            seq_lens=self.seq_lens[:rows],
            block_tables=self.block_tables[:rows],
            slot_mapping=self.slot_mapping[:tokens],
            capacity_tokens=self.max_pages * self.block_size,
            max_seq_len=self.max_pages * self.block_size,  # the indexer's page bound: every column
        )

    def _capture_batch(self, tokens: int) -> ForwardBatch:
        self._fill_padding(0, 0, tokens)  # for the capture, one padding sequence holds every token
        return self._static_batch(tokens)

    def graph_tokens(self, batch: ForwardBatch) -> int | None:
        """The captured chunk size a prefill batch runs in, or None (too many tokens or sequences, or a
        block table wider than the graphs')."""
        if not batch.is_prefill or batch.block_tables.shape[1] > self.max_pages or batch.num_seqs > self.max_seqs:
            return None
        t = batch.input_ids.shape[0]
        return next((s for s in self.token_sizes if s >= t and self.rows(s) > batch.num_seqs), None)

    def _fill_padding(self, n: int, t: int, tokens: int) -> None:
        """Rows n.. and tokens t..tokens: the padding sequence (row n) takes the tokens, the rows past it
        none."""
        rows = self.rows(tokens)
        self._pad(n, t, rows, tokens)
        self.cu_query_lens[n + 1: rows + 1].fill_(tokens)

    @torch.inference_mode()
    def run(self, batch: ForwardBatch, start: StartMark | None = None) -> torch.Tensor:
        """Logits [B, vocab] of a prefill batch by graph replay (the eager forward where no graph fits);
        `start` as in `DecodeGraphs.run`."""
        tokens = self.graph_tokens(batch)
        if tokens is None:
            mark_start(start)
            return self.model(batch, self.cache)
        n, t = batch.num_seqs, batch.input_ids.shape[0]
        self._copy_in(batch)
        self.cu_query_lens[: n + 1].copy_(batch.cu_query_lens)
        self._fill_padding(n, t, tokens)
        mark_start(start)
        self.graphs[tokens].replay()
        return self.logits[tokens][:n]
