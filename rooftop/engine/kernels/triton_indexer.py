"""Decode lightning indexer in Triton: matches `reference.indexer_topk_decode`, but its work follows
each sequence's actual length, read on the device, while its launch shape stays fixed.

Stage 1 (score): grid (B, programs per sequence); a program walks the pages pid, pid+G, ... below
its sequence's length, scoring S keys at a time as one `tl.dot` [S, D] x [D, H], ReLU, weighted
head sum in fp32. Pages past the length are never read, so `num_pages` (the capacity) only sizes
the score buffer, not the time. Stage 2 (select): one program per sequence finds the exact k-th
largest score by a 4-pass radix select (8 bits a pass, `tl.histogram`) over its own length and
compacts the winners. Stage 3 orders the k winners best first with a fixed-size torch sort.

Prefill uses the same kernels with each new token as a query of its own (`indexer_topk_prefill`).
"""

import torch
import triton
import triton.language as tl

from rooftop.engine.kernels import pdl
from rooftop.engine.kernels.pdl import launch_dependents_and_wait


@triton.jit
def _indexer_score_kernel(
    q_ptr, w_ptr, k_ptr, tables_ptr, seq_lens_ptr, scores_ptr,
    stride_qb, stride_qh, stride_wb, stride_tb, stride_sb,
    num_heads, head_dim, block_size, programs, max_len,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr,
):
    launch_dependents_and_wait(PDL)  # (`pdl`)
    b = tl.program_id(0)
    first = tl.program_id(1)
    seq_len = tl.minimum(tl.load(seq_lens_ptr + b).to(tl.int32), max_len)
    pages = (seq_len + block_size - 1) // block_size
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    s = tl.arange(0, BLOCK_S)
    h_ok = h < num_heads
    q = tl.load(q_ptr + b * stride_qb + h[:, None] * stride_qh + d[None, :],
                mask=h_ok[:, None] & (d < head_dim)[None, :], other=0.0)  # [H, D]
    w = tl.load(w_ptr + b * stride_wb + h, mask=h_ok, other=0.0).to(tl.float32)
    iters = tl.maximum(pages - first + programs - 1, 0) // programs
    for i in range(0, iters):
        page = first + i * programs
        block = tl.load(tables_ptr + b * stride_tb + page).to(tl.int64)
        pos = page * block_size + s
        ok = (s < block_size) & (pos < seq_len)
        keys = tl.load(k_ptr + (block * block_size + s)[:, None] * head_dim + d[None, :],
                       mask=ok[:, None] & (d < head_dim)[None, :], other=0.0)  # [S, D]
        logits = tl.dot(keys, tl.trans(q))  # [S, H] fp32
        score = tl.sum(tl.maximum(logits, 0.0) * w[None, :], axis=1)
        tl.store(scores_ptr + b * stride_sb + pos, score, mask=ok)


@triton.jit
def _ordered_key(x):
    """fp32 -> uint32 whose unsigned order is the float order."""
    bits = x.to(tl.int32, bitcast=True)
    flip = (bits >> 31) | -2147483648  # all ones for negatives, the sign bit for positives
    return (bits ^ flip).to(tl.uint32, bitcast=True)


@triton.jit
def _picked(o, ok, table_row, block_size, SLOTS: tl.constexpr):
    """What a pick at position o is written as: the position, or with SLOTS its flat cache slot
    (the table's block for it times block_size plus the offset); -1 where not ok."""
    if SLOTS:
        block = tl.load(table_row + o // block_size, mask=ok, other=0).to(tl.int64)
        value = block * block_size + o % block_size
    else:
        value = o.to(tl.int64)
    return tl.where(ok, value, -1)


@triton.jit
def _topk_select_kernel(
    scores_ptr, seq_lens_ptr, out_ptr, tables_ptr, stride_sb, stride_ob, stride_tb, topk, max_len, block_size,
    BLOCK: tl.constexpr, SLOTS: tl.constexpr, PDL: tl.constexpr,
):
    launch_dependents_and_wait(PDL)  # (`pdl`)
    b = tl.program_id(0)
    seq_len = tl.minimum(tl.load(seq_lens_ptr + b).to(tl.int32), max_len)
    row = scores_ptr + b * stride_sb
    orow = out_ptr + b * stride_ob
    table_row = tables_ptr + b * stride_tb
    offs = tl.arange(0, BLOCK)
    chunks = (seq_len + BLOCK - 1) // BLOCK
    if seq_len <= topk:
        # Everything visible is picked; the rest is -1.
        for i in range(0, (topk + BLOCK - 1) // BLOCK):
            o = i * BLOCK + offs
            tl.store(orow + o, _picked(o, o < seq_len, table_row, block_size, SLOTS), mask=o < topk)
    else:
        bins = tl.arange(0, 512)
        prefix = tl.zeros([1], tl.uint32)
        prefix_mask = tl.zeros([1], tl.uint32)
        remaining = tl.zeros([1], tl.int32) + topk  # how many still to take at or below the prefix
        for p in tl.static_range(4):
            shift = 24 - 8 * p
            hist = tl.zeros([512], tl.int32)
            for i in range(0, chunks):
                o = i * BLOCK + offs
                key = _ordered_key(tl.load(row + o, mask=o < seq_len, other=0.0))
                match = (o < seq_len) & ((key & prefix_mask) == prefix)
                digit = tl.where(match, (key >> shift) & 255, 256).to(tl.int32)  # bin 256: not matching
                hist += tl.histogram(digit, 512)
            hist = tl.where(bins < 256, hist, 0)
            at_or_above = tl.cumsum(hist, 0, reverse=True)  # elements with digit >= bin
            digit_k = tl.max(tl.where(at_or_above >= remaining, bins, -1), 0)  # the k-th's digit
            above = tl.sum(tl.where(bins == digit_k, at_or_above - hist, 0), 0)
            remaining -= above
            prefix |= digit_k.to(tl.uint32) << shift
            prefix_mask |= tl.full([1], 255, tl.uint32) << shift
        # prefix is now the k-th largest key: take all above it and the first `remaining` equal to it.
        written = tl.zeros([1], tl.int32)
        ties = tl.zeros([1], tl.int32)
        for i in range(0, chunks):
            o = i * BLOCK + offs
            in_seq = o < seq_len
            key = _ordered_key(tl.load(row + o, mask=in_seq, other=0.0))
            greater = in_seq & (key > prefix)
            equal = in_seq & (key == prefix)
            tie_rank = ties + tl.cumsum(equal.to(tl.int32), 0) - 1
            take = greater | (equal & (tie_rank < remaining))
            dest = written + tl.cumsum(take.to(tl.int32), 0) - 1
            tl.store(orow + dest, _picked(o, take, table_row, block_size, SLOTS), mask=take)
            written += tl.sum(take.to(tl.int32), 0)
            ties += tl.sum(equal.to(tl.int32), 0)


def programs_per_seq(batch: int, num_pages: int, num_sms: int = 132) -> int:
    """Stage-1 programs per sequence: about 4 waves of the GPU, at most one per page (shapes only)."""
    return max(1, min(num_pages, triton.cdiv(4 * num_sms, max(batch, 1))))


def indexer_topk_decode(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_k_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    num_pages: int,
    topk: int,
    ordered: bool = True,
    slots: bool = False,
) -> torch.Tensor:
    """Same contract as `reference.indexer_topk_decode`; `num_pages` only bounds the grid and buffers.

    Positions at or past num_pages * block_size are never scored (as in the reference). With
    `ordered=False` the k winners come in position order (-1 after them), not best first: the
    sparse attention after it does not care, and the ordering sort costs ~20 us a layer. With
    `slots` (unordered only) they come as flat cache slots through each row's block table, as
    `positions_to_slots` would give them, with no kernel of its own.
    """
    if slots and ordered:
        raise ValueError("indexer_topk_decode: slots=True needs ordered=False")
    batch, num_heads, head_dim = q.shape
    block_size = index_k_cache.shape[1]
    q = q.contiguous()
    if weights.stride(-1) != 1:  # rows may be strided (a slice of a stacked projection's output)
        weights = weights.contiguous()
    tables = block_tables.contiguous()
    num_pages = min(num_pages, tables.shape[1])
    # Lengths past the scored pages are clamped in the kernels, as the reference masks them.
    lens = seq_lens.contiguous()
    scores = torch.empty(batch, max(num_pages, 1) * block_size, dtype=torch.float32, device=q.device)
    out = torch.empty(batch, topk, dtype=torch.long, device=q.device)
    if batch == 0:
        return out
    programs = programs_per_seq(batch, num_pages, _num_sms(q.device))
    _indexer_score_kernel[(batch, programs)](
        q, weights, index_k_cache, tables, lens, scores,
        q.stride(0), q.stride(1), weights.stride(0), tables.stride(0), scores.stride(0),
        num_heads, head_dim, block_size, programs, num_pages * block_size,
        BLOCK_H=max(16, triton.next_power_of_2(num_heads)),
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_S=max(16, triton.next_power_of_2(block_size)),
        num_warps=4, **pdl.args("attention", q.device, batch),
    )
    _topk_select_kernel[(batch,)](scores, lens, out, tables, scores.stride(0), out.stride(0), tables.stride(0), topk,
                                  num_pages * block_size, block_size, BLOCK=1024, SLOTS=slots, num_warps=8,
                                  **pdl.args("attention", q.device, batch))
    if not ordered:
        return out
    # Best first: order the k winners by score (fixed size [B, topk], whatever the capacity).
    picked = scores.gather(1, out.clamp(min=0)).masked_fill(out < 0, float("-inf"))
    order = picked.argsort(dim=1, descending=True)
    return out.gather(1, order)


# Prefill scores at most this many (token, position) pairs at a time: [tokens, pages * block] fp32.
PREFILL_SCORE_ELEMENTS = 1 << 25


def indexer_topk_prefill(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_k_cache: torch.Tensor,
    block_tables: torch.Tensor,
    token_seq: torch.Tensor,
    positions: torch.Tensor,
    num_pages: int,
    topk: int,
    slots: bool = False,
) -> torch.Tensor:
    """Prefill picks on the device: each new token is scored as a decode query of its own, over its
    sequence's block table up to its own position (causal), by the decode kernels above (with
    `slots`, as flat cache slots).

    q [T, H, D], weights [T, H], token_seq [T] (each token's row of block_tables), positions [T];
    `num_pages` bounds the pages scored (the batch's longest sequence, known on the host). Picks come
    in position order, valid ones first (-1 after them), as `ordered=False` decode picks: the sparse
    attention after them does not care. No host sync, no per-sequence loop: a chunk's indexer is the
    same two kernels whatever its sequences' lengths (the torch reference loops over sequences with
    their lengths on the host). Tokens go in slices of PREFILL_SCORE_ELEMENTS scores.
    """
    num_tokens = q.shape[0]
    block_size = index_k_cache.shape[1]
    num_pages = max(1, min(num_pages, block_tables.shape[1]))
    tables = block_tables.index_select(0, token_seq.long())
    lens = (positions + 1).to(torch.int32)
    step = max(1, PREFILL_SCORE_ELEMENTS // (num_pages * block_size))
    if step >= num_tokens:
        return indexer_topk_decode(q, weights, index_k_cache, tables, lens, num_pages, topk, ordered=False, slots=slots)
    return torch.cat([
        indexer_topk_decode(q[t:t + step], weights[t:t + step], index_k_cache, tables[t:t + step], lens[t:t + step],
                            num_pages, topk, ordered=False, slots=slots)
        for t in range(0, num_tokens, step)
    ])


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count
