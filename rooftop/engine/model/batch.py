"""What one forward step gets: the new tokens of every sequence and where their cache lives."""

import math
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class ForwardBatch:
    """One step's inputs; all prefill (chunks of prompts) or all decode (one new token per sequence)."""

    is_prefill: bool
    input_ids: torch.Tensor  # LongTensor[T]: new tokens of all sequences, concatenated
    positions: torch.Tensor  # LongTensor[T]: absolute position of each new token
    cu_query_lens: torch.Tensor  # IntTensor[B+1]: offsets of each sequence's new tokens in input_ids
    query_lens: list[int]  # new tokens per sequence
    seq_lens: torch.Tensor  # IntTensor[B]: tokens in the cache after this step (cached + new)
    block_tables: torch.Tensor  # IntTensor[B, max_blocks]: physical block ids, -1 padding
    slot_mapping: torch.Tensor  # LongTensor[T]: block * block_size + offset for each new token
    capacity_tokens: int  # the server's --context-length
    indexer_bound: str = "actual"  # "actual" | "capacity"
    max_seq_len: int = 0  # max(seq_lens), known on the host (0 = unknown: use the table width)
    seq_lens_host: list[int] | None = None  # seq_lens as the host built them (None: ask the device)

    @property
    def num_seqs(self) -> int:
        """Sequences in the batch (B)."""
        return len(self.query_lens)


@dataclass(slots=True)
class StepTensors:
    """Tensors derived once per step from a ForwardBatch and read by every layer."""

    cos: torch.Tensor  # float32 [T, rope_dim / 2]
    sin: torch.Tensor
    token_seq: torch.Tensor  # LongTensor[T]: each new token's sequence index
    valid_lens: torch.Tensor  # IntTensor[T]: picks of the indexer that can be valid, min(position + 1, top-k)


def capacity_pages(capacity_tokens: int, block_size: int) -> int:
    """Block-table columns the capacity bound scores: ceil(capacity / block_size)."""
    return math.ceil(capacity_tokens / block_size)


def build_batch(
    new_tokens: list[list[int]],
    cached_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    capacity_tokens: int,
    indexer_bound: str = "actual",
    device: str | torch.device = "cpu",
) -> ForwardBatch:
    """Build a ForwardBatch from plain lists: each sequence's new tokens, cached length and blocks.

    A decode batch is one where every sequence brings exactly one token after a non-empty cache.
    With the capacity bound, block tables are padded with -1 to ceil(capacity / block_size) columns.
    """
    if indexer_bound not in ("actual", "capacity"):
        raise ValueError(f"indexer_bound must be actual or capacity, not {indexer_bound!r}")
    query_lens = [len(t) for t in new_tokens]
    seq_lens = [c + q for c, q in zip(cached_lens, query_lens, strict=True)]
    positions, slots = [], []
    for cached, q, table in zip(cached_lens, query_lens, block_tables, strict=True):
        for pos in range(cached, cached + q):
            positions.append(pos)
            slots.append(table[pos // block_size] * block_size + pos % block_size)
    width = max(len(t) for t in block_tables)
    if indexer_bound == "capacity":
        width = max(width, capacity_pages(capacity_tokens, block_size))
    padded = [t + [-1] * (width - len(t)) for t in block_tables]
    cu = [0]
    for q in query_lens:
        cu.append(cu[-1] + q)
    is_prefill = not all(q == 1 and c > 0 for q, c in zip(query_lens, cached_lens, strict=True))
    return ForwardBatch(
        is_prefill=is_prefill,
        input_ids=torch.tensor([t for seq in new_tokens for t in seq], dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        cu_query_lens=torch.tensor(cu, dtype=torch.int32, device=device),
        query_lens=query_lens,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        capacity_tokens=capacity_tokens,
        indexer_bound=indexer_bound,
        max_seq_len=max(seq_lens),
        seq_lens_host=seq_lens,
    )
