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
    # speculation's verify steps: the rows of input_ids whose logits the model returns (None: each sequence's
    # last), and whether it returns the final-normed hidden states of every token beside them (MTP reads them)
    logit_rows: torch.Tensor | None = None
    return_hidden: bool = False

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
    padded = [table + [-1] * (width - len(table)) for table in block_tables]
    cu = [0]
    for q in query_lens:
        cu.append(cu[-1] + q)
    is_prefill = not all(q == 1 and c > 0 for q, c in zip(query_lens, cached_lens, strict=True))
    # One host tensor, one copy to the device, then views: torch.tensor(..., device="cuda") waits for the
    # stream to drain (a synchronous copy) and would stall a step launched while the previous one runs.
    # Each view starts 16 bytes in, as Triton specialises its kernels on pointer alignment.
    flat: list[int] = []
    starts = [_append(flat, [tok for seq in new_tokens for tok in seq], 2), _append(flat, positions, 2),
              _append(flat, slots, 2)]
    ints_from = len(flat)
    starts += [_append(flat, cu, 4, ints_from), _append(flat, seq_lens, 4, ints_from),
               _append(flat, [page for row in padded for page in row], 4, ints_from)]
    packed = host_to_device(flat, torch.long, device)
    ints = packed[ints_from:].to(torch.int32)
    t, b = len(positions), len(query_lens)
    return ForwardBatch(
        is_prefill=is_prefill,
        input_ids=packed[starts[0]:starts[0] + t],
        positions=packed[starts[1]:starts[1] + t],
        cu_query_lens=ints[starts[3]:starts[3] + b + 1],
        query_lens=query_lens,
        seq_lens=ints[starts[4]:starts[4] + b],
        block_tables=ints[starts[5]:starts[5] + b * width].view(b, width),
        slot_mapping=packed[starts[2]:starts[2] + t],
        capacity_tokens=capacity_tokens,
        indexer_bound=indexer_bound,
        max_seq_len=max(seq_lens),
        seq_lens_host=seq_lens,
    )


def _append(flat: list[int], values: list[int], multiple: int, base: int = 0) -> int:
    """Append values to flat after zeros that make (their start - base) a multiple; return that start."""
    flat += [0] * (-(len(flat) - base) % multiple)
    start = len(flat) - base
    flat += values
    return start


def host_to_device(values: list, dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """A tensor of `values` on `device`. On CUDA it goes through pinned memory and an asynchronous copy,
    so the host does not wait for the kernels already queued (the caching host allocator keeps the
    pinned block until the copy is done)."""
    host = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
