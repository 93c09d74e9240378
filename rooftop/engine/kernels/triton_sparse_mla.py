"""Split-K sparse MLA decode in Triton: matches `reference.sparse_mla`, graph-safe, no host sync.

Grid (tokens x head groups, splits). A program takes one query token, a tile of heads (BLOCK_H,
at least 16 so the scores and the weighted sum are tensor-core `tl.dot`s) and one slice of the
top-k range: it gathers those latent rows once through the flat slot indices (-1 = invalid) and
keeps an online softmax in fp32, then writes its partial output and log-sum-exp. The splits are
merged by their LSE: where a program's share of the partials is small, by the last split of its
(token, head tile) to finish (an arrival counter, `arrivals.py`: no second launch); else by a
second kernel, one program a (token, head). With one split the kernel writes the output itself.

Two layouts: heads as the MMA's M (up to 32 heads; the latent part in four column blocks, so the
score MMAs form four independent chains) and rows as M (64 heads and more: warpgroup MMA on sm_90).
Where the time goes on an H200, and what was tried: docs/perf/kernels-h200.md.
"""

import math
import re

import torch
import triton
import triton.language as tl

from rooftop.engine.kernels import pdl
from rooftop.engine.kernels.arrivals import arrive_last, counters, rearm
from rooftop.engine.kernels.pdl import launch_dependents_and_wait
from rooftop.engine.kernels.sparse_mla_operands import LOG2E, operands

# Splits of the top-k range at most; the combine kernel is compiled for this many whatever the batch
# (a batch-dependent block would compile a new kernel the first time a prefill of that size came).
MAX_SPLITS = 16
# The last split merges in-kernel where a program's partials (head tile x splits x rank, 16-bit where
# the output is) are at most this many bytes over at most MERGE_IN_KERNEL_MAX_SPLITS splits: one
# program reads them all. Else a second kernel spreads the merge over (token, head) programs, on fp32
# partials. Partials merged in-kernel are 16-bit, as vLLM's paged attention v2 keeps its partitions'
# `tmp_out` in the output dtype (each partial is already divided by its softmax sum, so within the
# range of the cached latent values; the LSEs stay fp32). H200, top-k 2048, read flush
# (benchmarks/sparse_mla_merge_ab_gpu.py, docs/perf/engine-serve-h200.md):
#   16 heads x 64 (4 splits, 64 KB): 16-bit in-kernel 49.4 us, fp32 + merge kernel 51.0;
#   16 heads x 128 (2 splits, 32 KB): 16-bit in-kernel 84.2 us, fp32 + merge kernel 88.6;
#   32 heads x 64 (4 splits, 128 KB): 16-bit in-kernel 66.9 us, fp32 + merge kernel 69.6; at a valid
#     length of 288 (the engine's C=64 step) 26.4 against 29.6;
#   16 heads x 32 (8 splits, 128 KB): fp32 + merge kernel 32.1 us, 16-bit in-kernel 33.1;
#   16-bit partials with the merge kernel were slower than fp32 at every shape (53.8 us at 16 x 64);
#   one program merging 1 MB (batch 1, 32 heads, 16 splits) made the C=1 step ~0.4 ms slower.
# fp32 partials (fp32 outputs, or PARTIAL_DTYPE "float32") get half the bytes: at 16 heads x 64 their
# 128 KB in-kernel took 52.5 us against 51.0 with the merge kernel.
MERGE_IN_KERNEL_BYTES = 128 << 10
MERGE_IN_KERNEL_MAX_SPLITS = 4
# "float32" keeps in-kernel partials fp32 too (benchmarks compare).
PARTIAL_DTYPE = "output"


@triton.jit
def _program_tile(num_heads, head_groups, rank, row_width,
                  BLOCK_H: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DR: tl.constexpr, EVEN_D: tl.constexpr):
    """This program's token, split, head tile and latent/RoPE column ranges (with their masks)."""
    pid = tl.program_id(0)
    token = pid // head_groups
    heads = (pid % head_groups) * BLOCK_H + tl.arange(0, BLOCK_H)
    dv = tl.arange(0, BLOCK_DV)
    dr = tl.arange(0, BLOCK_DR)
    if EVEN_D:  # the latent and RoPE widths are the blocks' own: no masks along them
        dv_ok = dv < BLOCK_DV
        dr_ok = dr < BLOCK_DR
    else:
        dv_ok = dv < rank
        dr_ok = dr < row_width - rank
    return token, tl.program_id(1), heads, heads < num_heads, dv, dr, dv_ok, dr_ok


@triton.jit
def _split_range(lens_ptr, token, split, topk, keys_per_split, num_splits,
                 BLOCK_N: tl.constexpr, HAS_LENS: tl.constexpr):
    """The [lo, hi) of the top-k range this split reads."""
    if HAS_LENS:
        # Slots at or past the token's valid length are all -1: not read. The splits share the
        # valid range evenly (else the first split would do all of a short sequence's work).
        k_end = tl.minimum(tl.load(lens_ptr + token), topk)
        per_split = tl.cdiv(tl.cdiv(k_end, num_splits), BLOCK_N) * BLOCK_N
        k_lo = split * per_split
        k_hi = tl.minimum(k_lo + per_split, k_end)
    else:
        k_lo = split * keys_per_split
        k_hi = tl.minimum(k_lo + keys_per_split, topk)
    return k_lo, k_hi


@triton.jit
def _slot_tile(slots_row, start, k_hi, BLOCK_N: tl.constexpr):
    """Slots [start, start + BLOCK_N) of a token's top-k row; -1 past k_hi."""
    n = start + tl.arange(0, BLOCK_N)
    return tl.load(slots_row + n, mask=n < k_hi, other=-1)


@triton.jit
def _split_slots(slots_ptr, stride_st, lens_ptr, token, split, topk, keys_per_split, num_splits,
                 BLOCK_N: tl.constexpr, HAS_LENS: tl.constexpr):
    """This split's [k_lo, k_hi), the token's slot row and its first tile of slots."""
    k_lo, k_hi = _split_range(lens_ptr, token, split, topk, keys_per_split, num_splits, BLOCK_N, HAS_LENS)
    slots_row = slots_ptr + token * stride_st
    return k_lo, k_hi, slots_row, _slot_tile(slots_row, k_lo, k_hi, BLOCK_N)


@triton.jit
def _next_slots(slots_row, start, k_hi, slot_next, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr):
    """The slots of the tile at `start`, and the slots to carry to the next iteration.

    With PREFETCH the next tile's slots are loaded a tile ahead and carried in registers, so the
    row loads depend on no load of their own iteration and Triton's pipeliner gives them all of
    num_stages (num_stages - 1 row tiles in flight). Loaded in the same iteration, the slots take
    the pipeline's first stages and leave the rows one buffer whatever num_stages is (up to 4):
    one tile in flight, which held the H200 to ~60% of its copy rate.
    """
    if PREFETCH:
        slot = slot_next
        slot_next = _slot_tile(slots_row, start + BLOCK_N, k_hi, BLOCK_N)
    else:
        slot = _slot_tile(slots_row, start, k_hi, BLOCK_N)
    return slot, slot_next


@triton.jit
def _tile_rows(kv_ptr, slots_row, start, k_hi, slot_next, row_width, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr):
    """The tile at `start`: which of its rows are valid, pointers to them [N, 1] (one read of a row
    serves as key and value), and the slots to carry to the next iteration."""
    slot, slot_next = _next_slots(slots_row, start, k_hi, slot_next, BLOCK_N, PREFETCH)
    valid = slot >= 0
    return valid, kv_ptr + slot.to(tl.int64)[:, None] * row_width, slot_next


@triton.jit
def _rope_part(rows, valid, rank, dr, dr_ok):
    """The RoPE part [N, DR] of the rows at `rows` (invalid rows read as 0)."""
    return tl.load(rows + rank + dr[None, :], mask=valid[:, None] & dr_ok[None, :], other=0.0)


@triton.jit
def _block_cols(j, rank, DQ: tl.constexpr, EVEN_D: tl.constexpr):
    """Latent columns [j * DQ, (j + 1) * DQ) and which of them are within the rank."""
    cols = j * DQ + tl.arange(0, DQ)
    if EVEN_D:
        return cols, cols < (j + 1) * DQ
    return cols, cols < rank


@triton.jit
def _load_block(base, ok, j, rank, DQ: tl.constexpr, EVEN_D: tl.constexpr):
    """Column block j of the rows at `base` ([R, 1] pointers; rows with `ok` false read as 0)."""
    cols, cols_ok = _block_cols(j, rank, DQ, EVEN_D)
    return tl.load(base + cols[None, :], mask=ok[:, None] & cols_ok[None, :], other=0.0)


@triton.jit
def _store_block(base, ok, j, val, rank, DQ: tl.constexpr, EVEN_D: tl.constexpr):
    cols, cols_ok = _block_cols(j, rank, DQ, EVEN_D)
    tl.store(base + cols[None, :], val.to(base.dtype.element_ty), mask=ok[:, None] & cols_ok[None, :])


@triton.jit
def _split_weights(lse, AXIS: tl.constexpr):
    """Each split's share of the merged output, from the splits' LSEs (log2 units) along AXIS: 0 for an
    empty split (-inf), and all 0 where every split is empty."""
    m = tl.max(lse, axis=AXIS, keep_dims=True)
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))
    return w / tl.maximum(tl.sum(w, axis=AXIS, keep_dims=True), 1e-30)


@triton.jit
def _merge_if_last(count_ptr, part_ptr, lse_ptr, out_ptr, token, heads, head_ok, num_heads, num_splits, rank,
                   stride_ot, stride_oh, BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr,
                   EVEN_D: tl.constexpr):
    """After a split stored its partial and LSE: the last split of this program's (token, head tile)
    to arrive weighs all splits' partials by their LSE into out and re-arms the counter. Every
    load is a whole [heads, splits(, columns)] tile, so the merge costs a few L2 round trips, not one a
    split; partials are read through L2 (.cg): other SMs wrote them."""
    counter = count_ptr + tl.program_id(0)
    if arrive_last(counter, num_splits):
        DQ: tl.constexpr = BLOCK_DV // 4
        sp = tl.arange(0, BLOCK_S)
        rows = (token * num_heads + heads)[:, None] * num_splits + sp[None, :]  # [H, S] rows of part [T, H, S, rank]
        ok = head_ok[:, None] & (sp < num_splits)[None, :]
        w = _split_weights(tl.load(lse_ptr + rows, mask=ok, other=float("-inf"), cache_modifier=".cg"), 1)
        dest = out_ptr + token * stride_ot + heads[:, None] * stride_oh
        for j in tl.static_range(4):
            cols, cols_ok = _block_cols(j, rank, DQ, EVEN_D)
            part = tl.load(part_ptr + rows[:, :, None] * rank + cols[None, None, :],
                           mask=ok[:, :, None] & cols_ok[None, None, :], other=0.0, cache_modifier=".cg")
            _store_block(dest, head_ok, j, tl.sum(part * w[:, :, None], axis=1), rank, DQ, EVEN_D)
        rearm(counter)


@triton.jit
def _sparse_mla_split_kernel(
    q_ptr, qr_ptr, kv_ptr, slots_ptr, lens_ptr, out_ptr, part_ptr, lse_ptr, count_ptr,
    stride_qt, stride_qh, stride_rt, stride_rh, stride_st, stride_ot, stride_oh,
    num_heads, topk, keys_per_split, row_width, rank, scale_log2, num_splits, head_groups,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DR: tl.constexpr,
    ONE_SPLIT: tl.constexpr, HAS_LENS: tl.constexpr, EVEN_D: tl.constexpr, PREFETCH: tl.constexpr,
    MERGE: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr,
):
    """Heads as the M dimension, the latent part in four column blocks of DQ: each block is its own
    load, score dot and output dot. The four score dots start from zero and are summed after (by
    fma: Triton folds `dot + c` into a dot accumulating on c, which chains them again), so their
    MMA chains run side by side instead of one chain through all 576 columns: 11% faster at 32
    heads on the H200, the same within ±2% at 16 (docs/perf/kernels-h200.md)."""
    launch_dependents_and_wait(PDL)  # where it merges in-kernel, W_UV's GEMV is next (`pdl`)
    DQ: tl.constexpr = BLOCK_DV // 4
    token, split, heads, head_ok, _, dr, _, dr_ok = _program_tile(
        num_heads, head_groups, rank, row_width, BLOCK_H, BLOCK_DV, BLOCK_DR, EVEN_D)

    q_rows = q_ptr + token * stride_qt + heads[:, None] * stride_qh
    q0 = _load_block(q_rows, head_ok, 0, rank, DQ, EVEN_D)
    q1 = _load_block(q_rows, head_ok, 1, rank, DQ, EVEN_D)
    q2 = _load_block(q_rows, head_ok, 2, rank, DQ, EVEN_D)
    q3 = _load_block(q_rows, head_ok, 3, rank, DQ, EVEN_D)
    q_rope = tl.load(qr_ptr + token * stride_rt + heads[:, None] * stride_rh + dr[None, :],
                     mask=head_ok[:, None] & dr_ok[None, :], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc0 = tl.zeros([BLOCK_H, DQ], tl.float32)
    acc1 = tl.zeros([BLOCK_H, DQ], tl.float32)
    acc2 = tl.zeros([BLOCK_H, DQ], tl.float32)
    acc3 = tl.zeros([BLOCK_H, DQ], tl.float32)
    k_lo, k_hi, slots_row, slot_next = _split_slots(slots_ptr, stride_st, lens_ptr, token, split, topk,
                                                     keys_per_split, num_splits, BLOCK_N, HAS_LENS)
    for start in range(k_lo, k_hi, BLOCK_N):
        valid, rows, slot_next = _tile_rows(kv_ptr, slots_row, start, k_hi, slot_next, row_width, BLOCK_N, PREFETCH)
        k0 = _load_block(rows, valid, 0, rank, DQ, EVEN_D)
        k1 = _load_block(rows, valid, 1, rank, DQ, EVEN_D)
        k2 = _load_block(rows, valid, 2, rank, DQ, EVEN_D)
        k3 = _load_block(rows, valid, 3, rank, DQ, EVEN_D)
        kr = _rope_part(rows, valid, rank, dr, dr_ok)
        s = tl.fma(tl.dot(q0, tl.trans(k0)), scale_log2, tl.dot(q1, tl.trans(k1)) * scale_log2)
        s = tl.fma(tl.dot(q2, tl.trans(k2)), scale_log2, s)
        s = tl.fma(tl.dot(q3, tl.trans(k3)), scale_log2, s)
        s = tl.fma(tl.dot(q_rope, tl.trans(kr)), scale_log2, s)  # [BLOCK_H, BLOCK_N] fp32, log2 units
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # Rows with nothing valid yet keep m = -inf; shift by 0 there so exp2 gives 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        p = p.to(k0.dtype)
        acc0 = acc0 * alpha[:, None] + tl.dot(p, k0)
        acc1 = acc1 * alpha[:, None] + tl.dot(p, k1)
        acc2 = acc2 * alpha[:, None] + tl.dot(p, k2)
        acc3 = acc3 * alpha[:, None] + tl.dot(p, k3)
        m_i = m_new

    inv = 1.0 / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if ONE_SPLIT:
        dest = out_ptr + token * stride_ot + heads[:, None] * stride_oh
    else:
        # LSE in log2 units; -inf marks a split with no valid row.
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        row = (token * num_heads + heads) * num_splits + split  # part [T, H, splits, rank]
        tl.store(lse_ptr + row, lse, mask=head_ok)
        dest = part_ptr + row[:, None] * rank
    _store_block(dest, head_ok, 0, acc0 * inv, rank, DQ, EVEN_D)
    _store_block(dest, head_ok, 1, acc1 * inv, rank, DQ, EVEN_D)
    _store_block(dest, head_ok, 2, acc2 * inv, rank, DQ, EVEN_D)
    _store_block(dest, head_ok, 3, acc3 * inv, rank, DQ, EVEN_D)
    if MERGE:
        _merge_if_last(count_ptr, part_ptr, lse_ptr, out_ptr, token, heads, head_ok, num_heads, num_splits, rank,
                       stride_ot, stride_oh, BLOCK_H, BLOCK_S, BLOCK_DV, EVEN_D)


@triton.jit
def _sparse_mla_rows_kernel(
    q_ptr, qr_ptr, kv_ptr, slots_ptr, lens_ptr, out_ptr, part_ptr, lse_ptr, count_ptr,
    stride_qt, stride_qh, stride_rt, stride_rh, stride_st, stride_ot, stride_oh,
    num_heads, topk, keys_per_split, row_width, rank, scale_log2, num_splits, head_groups,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DR: tl.constexpr,
    ONE_SPLIT: tl.constexpr, HAS_LENS: tl.constexpr, EVEN_D: tl.constexpr, PREFETCH: tl.constexpr,
    MERGE: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr,
):
    """The split kernel with rows as the M dimension: S^T = rows . Q^T [BLOCK_N, BLOCK_H] and
    O^T += rows^T . P^T [BLOCK_DV, BLOCK_H]: the output product's M is the latent width (512), which
    feeds Hopper's warpgroup MMA (M >= 64) whatever the head group and row tile (the score product's M
    is the row tile: 32 rows by default past 32 heads)."""
    launch_dependents_and_wait(PDL)
    token, split, heads, head_ok, dv, dr, dv_ok, dr_ok = _program_tile(
        num_heads, head_groups, rank, row_width, BLOCK_H, BLOCK_DV, BLOCK_DR, EVEN_D)

    q_nope_t = tl.load(q_ptr + token * stride_qt + heads[None, :] * stride_qh + dv[:, None],
                       mask=head_ok[None, :] & dv_ok[:, None], other=0.0)  # [DV, H]
    q_rope_t = tl.load(qr_ptr + token * stride_rt + heads[None, :] * stride_rh + dr[:, None],
                       mask=head_ok[None, :] & dr_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_DV, BLOCK_H], tl.float32)
    k_lo, k_hi, slots_row, slot_next = _split_slots(slots_ptr, stride_st, lens_ptr, token, split, topk,
                                                     keys_per_split, num_splits, BLOCK_N, HAS_LENS)
    for start in range(k_lo, k_hi, BLOCK_N):
        valid, rows, slot_next = _tile_rows(kv_ptr, slots_row, start, k_hi, slot_next, row_width, BLOCK_N, PREFETCH)
        kv = tl.load(rows + dv[None, :], mask=valid[:, None] & dv_ok[None, :], other=0.0)  # [N, DV]
        kr = _rope_part(rows, valid, rank, dr, dr_ok)
        s = tl.dot(kv, q_nope_t) + tl.dot(kr, q_rope_t)  # [N, H] fp32
        s = tl.where(valid[:, None], s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[None, :])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha[None, :] + tl.dot(tl.trans(kv), p.to(kv.dtype))
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[None, :]  # [DV, H]
    if ONE_SPLIT:
        o_ptrs = out_ptr + token * stride_ot + heads[None, :] * stride_oh + dv[:, None]
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=head_ok[None, :] & dv_ok[:, None])
    else:
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        row = (token * num_heads + heads) * num_splits + split
        tl.store(part_ptr + row[None, :] * rank + dv[:, None], out.to(part_ptr.dtype.element_ty),
                 mask=head_ok[None, :] & dv_ok[:, None])
        tl.store(lse_ptr + row, lse, mask=head_ok)
        if MERGE:
            _merge_if_last(count_ptr, part_ptr, lse_ptr, out_ptr, token, heads, head_ok, num_heads, num_splits,
                           rank, stride_ot, stride_oh, BLOCK_H, BLOCK_S, BLOCK_DV, EVEN_D)


@triton.jit
def _sparse_mla_combine_kernel(
    part_ptr, lse_ptr, out_ptr, stride_ot, stride_oh, num_heads, rank,
    num_splits, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr, PDL: tl.constexpr,
):
    launch_dependents_and_wait(PDL)  # W_UV's GEMV (`pdl`)
    pid = tl.program_id(0)  # token * num_heads + head
    token = pid // num_heads
    head = pid % num_heads
    sp = tl.arange(0, BLOCK_S)
    dv = tl.arange(0, BLOCK_DV)
    sp_ok = sp < num_splits
    w = _split_weights(tl.load(lse_ptr + pid * num_splits + sp, mask=sp_ok, other=float("-inf")), 0)
    part = tl.load(
        part_ptr + (pid * num_splits + sp)[:, None] * rank + dv[None, :],
        mask=sp_ok[:, None] & (dv < rank)[None, :], other=0.0,
    )
    out = tl.sum(part * w[:, None], axis=0)
    tl.store(out_ptr + token * stride_ot + head * stride_oh + dv, out.to(out_ptr.dtype.element_ty), mask=dv < rank)


# default_config's tiles (module constants, so benchmarks can A/B them): up to 32 heads, and past.
HEADS_AS_M_TILE = {"BLOCK_N": 32, "num_warps": 4, "num_stages": 3, "prefetch": True, "programs_per_sm": 2}
ROWS_AS_M_TILE = {"BLOCK_N": 32, "num_warps": 8, "num_stages": 3, "prefetch": True, "programs_per_sm": 1}
# Up to this many tokens, 17-32 heads go 16 to a program, one program an SM (twice the head groups,
# about half the splits). The `small` preset's graphed step on the H200 (32 heads; decode_ab_gpu.py,
# one process, ratio to 32-head programs, two an SM; docs/perf/engine-serve-h200.md):
#   context 288:  1 token x0.954, 2 x0.981, 4 x0.984, 8 x0.987, 16 x0.958, 32 x0.959, 64 x0.961;
#   context 4096: 1 token x0.974, 8 x1.001, 16 x1.004, 32 x1.045, 64 x1.131.
# Past 16 tokens a long context loses more than a short one gains: each latent row is read by two
# programs, and the kernel is no longer latency-bound. The graph for a batch size serves every context.
SPLIT_HEADS_MAX_TOKENS = 16


def default_config(num_tokens: int, num_heads: int, topk: int, num_sms: int = 132) -> dict:
    """Tile sizes and splits from shapes only (so a captured graph keeps them).

    From the H200 tile sweeps in docs/perf/kernels-h200.md (top-k 2048): up to 32 heads, heads-as-M
    programs of 32 rows a tile, 4 warps, the slots carried a tile ahead and 3 stages (two row tiles in
    flight, ~91 KB of shared memory at 16 heads and ~110 KB at 32, two programs an SM; the 32-head
    choice rests on the sweep, where it won at batch 32-128; up to SPLIT_HEADS_MAX_TOKENS tokens 16 heads
    a program, one program an SM, from the graphed step); 64 heads and more as 8-warp rows-as-M
    programs (warpgroup MMA) of 32-row tiles with the slots carried ahead and 3 stages (at 128 heads,
    batch 64 and 128: 194-196 TFLOP/s against 161-166 for 64-row tiles, 2 stages, no prefetch).
    Splits of the top-k range fill the GPU when batch x head groups alone does not.
    """
    if num_heads <= 32:
        cfg = {"BLOCK_H": 16 if num_heads <= 16 else 32, "rows_as_m": False, **HEADS_AS_M_TILE}
        if num_heads > 16 and num_tokens <= SPLIT_HEADS_MAX_TOKENS:
            cfg.update(BLOCK_H=16, programs_per_sm=1)
    else:
        cfg = {"BLOCK_H": 64, "rows_as_m": True, **ROWS_AS_M_TILE}
    programs_per_sm = cfg.pop("programs_per_sm")
    groups = math.ceil(num_heads / cfg["BLOCK_H"])
    splits = 1
    max_splits = max(1, min(MAX_SPLITS, topk // 128))
    while num_tokens * groups * splits * 2 <= programs_per_sm * num_sms and splits * 2 <= max_splits:
        splits *= 2
    return {**cfg, "splits": splits}


def _in_kernel_dtype(out_dtype: torch.dtype) -> torch.dtype:
    """The dtype of partials merged in-kernel, for an output of `out_dtype` (see PARTIAL_DTYPE)."""
    if PARTIAL_DTYPE == "output" and out_dtype in (torch.bfloat16, torch.float16):
        return out_dtype
    return torch.float32


def merge_plan(cfg: dict, kv_lora_rank: int, out_dtype: torch.dtype = torch.bfloat16) -> tuple[bool, torch.dtype]:
    """(whether the last split merges in-kernel, the partials' dtype) at `cfg` for an output of
    `out_dtype` (see MERGE_IN_KERNEL_BYTES)."""
    dtype = _in_kernel_dtype(out_dtype)
    splits = cfg["splits"]
    block = cfg["BLOCK_H"] * triton.next_power_of_2(splits) * kv_lora_rank * dtype.itemsize
    limit = MERGE_IN_KERNEL_BYTES if dtype.itemsize == 2 else MERGE_IN_KERNEL_BYTES // 2
    if 1 < splits <= MERGE_IN_KERNEL_MAX_SPLITS and block <= limit:
        return True, dtype
    return False, torch.float32


def merges_in_kernel(cfg: dict, kv_lora_rank: int, out_dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether the last split merges in-kernel at `cfg` (see MERGE_IN_KERNEL_BYTES)."""
    return merge_plan(cfg, kv_lora_rank, out_dtype)[0]


def sparse_mla(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    slots: torch.Tensor,
    kv_lora_rank: int,
    scale: float,
    config: dict | None = None,
    q_rope: torch.Tensor | None = None,
    valid_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as `reference.sparse_mla`: q [T, H, C] (or [T, H, rank] with q_rope [T, H, C - rank]),
    kv_cache [N, S, C], slots [T, K] -> [T, H, rank]. q may have any token/head strides (e.g. a
    transposed bmm output). With `valid_lens` [T] the work follows each token's valid slots."""
    num_tokens, num_heads = q.shape[:2]
    width = kv_cache.shape[-1]
    topk = slots.shape[1]
    q, q_rope, kv, slots = operands(q, kv_cache, slots, kv_lora_rank, q_rope)
    cfg = config or default_config(num_tokens, num_heads, topk, _num_sms(q.device))
    if config is None and cfg["splits"] == 1 and _gluon_takes(q, kv_cache, kv_lora_rank):
        from rooftop.engine.kernels import gluon_sparse_mla

        return gluon_sparse_mla.sparse_mla(q, kv_cache, slots, kv_lora_rank, scale, q_rope=q_rope,
                                           valid_lens=valid_lens)
    block_h, block_n, splits = cfg["BLOCK_H"], cfg["BLOCK_N"], cfg["splits"]
    if not 1 <= splits <= MAX_SPLITS:
        raise ValueError(f"sparse_mla splits must be 1..{MAX_SPLITS}, got {splits}")
    out = q.new_empty(num_tokens, num_heads, kv_lora_rank)
    if num_tokens == 0:
        return out
    groups = math.ceil(num_heads / block_h)
    keys_per_split = math.ceil(math.ceil(topk / splits) / block_n) * block_n
    merge, part_dtype = merge_plan(cfg, kv_lora_rank, q.dtype)
    if splits > 1:
        part = torch.empty(num_tokens, num_heads, splits, kv_lora_rank, dtype=part_dtype, device=q.device)
        lse = torch.empty(num_tokens, num_heads, splits, dtype=torch.float32, device=q.device)
    else:
        part = lse = out  # unused
    count = counters(q.device, num_tokens * groups) if merge else out
    kernel = _sparse_mla_rows_kernel if cfg.get("rows_as_m") else _sparse_mla_split_kernel
    lens = slots if valid_lens is None else valid_lens.to(torch.int32)  # unread without HAS_LENS
    block_dv = max(64, triton.next_power_of_2(kv_lora_rank))  # the split kernel's four blocks: K >= 16 each
    block_dr = max(16, triton.next_power_of_2(width - kv_lora_rank))
    kernel[(num_tokens * groups, splits)](
        q, q_rope, kv, slots, lens, out, part, lse, count,
        q.stride(0), q.stride(1), q_rope.stride(0), q_rope.stride(1), slots.stride(0), out.stride(0), out.stride(1),
        num_heads, topk, keys_per_split, width, kv_lora_rank, scale * LOG2E, splits, groups,
        BLOCK_H=block_h, BLOCK_N=block_n, BLOCK_DV=block_dv, BLOCK_DR=block_dr,
        ONE_SPLIT=splits == 1, HAS_LENS=valid_lens is not None, PREFETCH=cfg.get("prefetch", False),
        EVEN_D=block_dv == kv_lora_rank and block_dr == width - kv_lora_rank, MERGE=merge, BLOCK_S=triton.next_power_of_2(splits),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl.args("attention", q.device, num_tokens),
    )
    if splits > 1 and not merge:
        _sparse_mla_combine_kernel[(num_tokens * num_heads,)](
            part, lse, out, out.stride(0), out.stride(1), num_heads, kv_lora_rank,
            splits, BLOCK_S=MAX_SPLITS,
            BLOCK_DV=triton.next_power_of_2(kv_lora_rank), num_warps=4, **pdl.args("attention", q.device, num_tokens),
        )
    return out


@triton.jit
def _positions_to_slots_kernel(
    pos_ptr, seq_ptr, tables_ptr, out_ptr, stride_pt, stride_tb, topk, block_size, BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = k < topk
    pos = tl.load(pos_ptr + t * stride_pt + k, mask=ok, other=-1)
    seq = tl.load(seq_ptr + t).to(tl.int64)
    has = ok & (pos >= 0)
    page = tl.where(has, pos, 0) // block_size
    block = tl.load(tables_ptr + seq * stride_tb + page, mask=has, other=0).to(tl.int64)
    tl.store(out_ptr + t * topk + k, tl.where(has, block * block_size + pos % block_size, -1), mask=ok)


def positions_to_slots(
    positions: torch.Tensor, token_seq: torch.Tensor, block_tables: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Same contract as `reference.positions_to_slots`: positions [T, K] -> flat slots [T, K] (-1 kept)."""
    num_tokens, topk = positions.shape
    out = torch.empty(num_tokens, topk, dtype=torch.long, device=positions.device)
    if num_tokens and topk:
        positions, tables = positions.contiguous(), block_tables.contiguous()
        block = min(1024, triton.next_power_of_2(topk))
        _positions_to_slots_kernel[(num_tokens, triton.cdiv(topk, block))](
            positions, token_seq.contiguous(), tables, out, positions.stride(0), tables.stride(0), topk, block_size,
            BLOCK=block, num_warps=4,
        )
    return out


def _gluon_takes(q: torch.Tensor, kv_cache: torch.Tensor, kv_lora_rank: int) -> bool:
    """Whether the Gluon warpgroup-MMA kernel (`gluon_sparse_mla`) runs this call: 64 heads and more in
    one split on an sm_90 GPU, where it beat the rows-as-M kernel by ~1.6x at 128 heads on the H200
    (docs/perf/kernels-h200.md); a Triton without Gluon keeps the Triton kernels."""
    if not q.is_cuda or q.shape[1] < 64 or _triton_version() < GLUON_MIN_TRITON:
        return False
    try:
        from rooftop.engine.kernels import gluon_sparse_mla
    except ImportError:
        return False
    return gluon_sparse_mla.supports(q, kv_cache, kv_lora_rank)


# Gluon is experimental and its API moves between releases: the kernel was written and measured on 3.6.
GLUON_MIN_TRITON = (3, 6)


def _triton_version() -> tuple[int, int]:
    """(major, minor) of the installed Triton ("3.7rc1" -> (3, 7))."""
    major, minor = (triton.__version__.split(".") + ["0"])[:2]
    return int(major), int(re.match(r"\d*", minor).group() or 0)


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count
