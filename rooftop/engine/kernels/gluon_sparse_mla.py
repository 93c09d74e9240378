"""Sparse MLA decode at DeepSeek's head count on sm_90, in Gluon: 64 heads a program on warpgroup MMA.

The Triton kernels (`triton_sparse_mla`) hold their query tile and output in registers; past 32 heads
that spills (255 registers, 2.2 M local-memory requests a call at 128 heads x batch 64 on the H200:
docs/perf/kernels-h200.md) or leaves the tensor cores waiting on shared memory. Here the layout is
explicit:

- the program's query tile (64 heads x 512 latent + 64 RoPE) sits in shared memory for its life;
- gathered latent rows stream through a ring of STAGES tiles by cp.async (one read of a row serves
  as key and value, for all 64 heads);
- scores S = Q K^T and the output O += P V are warpgroup MMAs; the two warpgroups split S's rows
  and O's 512 columns (256 each: 128 fp32 registers a thread), and P goes through shared memory;
- while a tile's score MMA runs, the program loads that tile's slots (its mask) and issues the
  next tile's gathers. Queuing the next tile's score MMA behind this tile's output MMA instead (one
  stage of look-ahead, as 2 x 72 KB stages allow) was slower on the H200: 124.5 against 120.7 us.

Same contract as `triton_sparse_mla.sparse_mla` for one split (the whole top-k range a program),
bf16 q and cache, rank 512 and RoPE 64, heads a multiple of 64.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from rooftop.engine.kernels.sparse_mla_operands import LOG2E, operands

BLOCK_H = 64
RANK = 512
ROPE = 64


@gluon.jit
def _issue_tile(kv_ptr, slots_row, start, k_hi, row_width, kv_dst, kr_dst,
                BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr,
                ld_v: gl.constexpr, ld_r: gl.constexpr):
    """cp.async the latent rows of slots [start, start + BLOCK_N) (-1 or past k_hi: zeros) into a ring stage."""
    nv = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_v))
    sv = gl.load(slots_row + nv, mask=nv < k_hi, other=-1)
    dv = gl.arange(0, DV, layout=gl.SliceLayout(0, ld_v))
    async_copy.async_copy_global_to_shared(
        kv_dst, kv_ptr + sv.to(gl.int64)[:, None] * row_width + dv[None, :], mask=(sv >= 0)[:, None])
    nr = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_r))
    sr = gl.load(slots_row + nr, mask=nr < k_hi, other=-1)
    dr = gl.arange(0, DR, layout=gl.SliceLayout(0, ld_r))
    async_copy.async_copy_global_to_shared(
        kr_dst, kv_ptr + sr.to(gl.int64)[:, None] * row_width + DV + dr[None, :], mask=(sr >= 0)[:, None])


@gluon.jit
def _scores(q_smem, qr_smem, kv_t, kr_t, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """Issue S = Q K^T over the latent and RoPE parts (async; wait on the result)."""
    s = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)
    s = warpgroup_mma(q_smem, kv_t.permute((1, 0)), s, use_acc=False, is_async=True)
    return warpgroup_mma(qr_smem, kr_t.permute((1, 0)), s, is_async=True)


@gluon.jit
def _sparse_mla_wgmma_kernel(
    q_ptr, qr_ptr, kv_ptr, slots_ptr, lens_ptr, out_ptr,
    stride_qt, stride_qh, stride_rt, stride_rh, stride_st, stride_ot, stride_oh,
    num_heads, topk, row_width, scale_log2, head_groups,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr,
    STAGES: gl.constexpr, HAS_LENS: gl.constexpr,
):
    NW: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, NW // 4],
                                                       instr_shape=[16, BLOCK_N // (NW // 4), 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, NW // 4],
                                                       instr_shape=[16, DV // (NW // 4), 16])
    ld_v: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [NW, 1], [1, 0])
    ld_r: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, DV], gl.bfloat16)
    qr_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, DR], gl.bfloat16)
    kv_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, DV], gl.bfloat16)
    kr_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, DR], gl.bfloat16)
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16)

    pid = gl.program_id(0)
    token = pid // head_groups
    h0 = (pid % head_groups) * BLOCK_H

    # The query tile, into shared memory once.
    hv = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld_v))
    dv = gl.arange(0, DV, layout=gl.SliceLayout(0, ld_v))
    q = gl.load(q_ptr + token * stride_qt + hv[:, None] * stride_qh + dv[None, :], mask=(hv < num_heads)[:, None],
                other=0.0)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, DV], q_sl, q)
    hr = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld_r))
    dr = gl.arange(0, DR, layout=gl.SliceLayout(0, ld_r))
    qr = gl.load(qr_ptr + token * stride_rt + hr[:, None] * stride_rh + dr[None, :], mask=(hr < num_heads)[:, None],
                 other=0.0)
    qr_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, DR], qr_sl, qr)
    kv_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, DV], kv_sl)
    kr_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, DR], kr_sl)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N], p_sl)

    slots_row = slots_ptr + token.to(gl.int64) * stride_st
    if HAS_LENS:
        k_hi = gl.minimum(gl.load(lens_ptr + token), topk)
    else:
        k_hi = topk
    n_blocks = gl.cdiv(k_hi, BLOCK_N)
    for st in gl.static_range(STAGES - 1):
        _issue_tile(kv_ptr, slots_row, st * BLOCK_N, k_hi, row_width, kv_smem.index(st), kr_smem.index(st),
                    BLOCK_N, DV, DR, ld_v, ld_r)
        async_copy.commit_group()

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_layout))
    o = gl.zeros([BLOCK_H, DV], gl.float32, layout=o_layout)
    for j in range(n_blocks):
        stage = j % STAGES
        async_copy.wait_group(STAGES - 2)
        fence_async_shared()
        gl.thread_barrier()
        kv_t = kv_smem.index(stage)
        s_acc = _scores(q_smem, qr_smem, kv_t, kr_smem.index(stage), BLOCK_H, BLOCK_N, s_layout)
        # While the score MMA runs: this tile's slots (for the mask) and the next tiles' gathers.
        ns = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        valid = gl.load(slots_row + ns, mask=ns < k_hi, other=-1) >= 0
        nxt = j + STAGES - 1
        _issue_tile(kv_ptr, slots_row, nxt * BLOCK_N, k_hi, row_width, kv_smem.index(nxt % STAGES),
                    kr_smem.index(nxt % STAGES), BLOCK_N, DV, DR, ld_v, ld_r)
        async_copy.commit_group()
        s = warpgroup_mma_wait(num_outstanding=0, deps=[s_acc])
        s = gl.where(valid[None, :], s * scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # no valid row yet: exp2 gives 0, not NaN
        p = gl.exp2(s - m_safe[:, None])
        alpha = gl.exp2(m_i - m_safe)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        p_smem.store(p.to(gl.bfloat16))
        fence_async_shared()
        gl.thread_barrier()
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        o = warpgroup_mma(p_smem, kv_t, o, is_async=True)
        o = warpgroup_mma_wait(num_outstanding=0, deps=[o])
        gl.thread_barrier()  # p_smem and this stage are free for the next iteration's writes
    async_copy.wait_group(0)

    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    o = o / gl.where(l_o > 0, l_o, 1.0)[:, None]
    ho = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))
    do = gl.arange(0, DV, layout=gl.SliceLayout(0, o_layout))
    gl.store(out_ptr + token * stride_ot + ho[:, None] * stride_oh + do[None, :], o.to(gl.bfloat16),
             mask=(ho < num_heads)[:, None])


def supports(q: torch.Tensor, kv_cache: torch.Tensor, kv_lora_rank: int) -> bool:
    """Whether `sparse_mla` takes these: bf16 on an sm_90 GPU, rank 512 + RoPE 64, heads a multiple of 64."""
    return (q.is_cuda and q.dtype == torch.bfloat16 and kv_cache.dtype == torch.bfloat16
            and torch.cuda.get_device_capability(q.device) == (9, 0)
            and kv_lora_rank == RANK and kv_cache.shape[-1] == RANK + ROPE and q.shape[1] % BLOCK_H == 0)


def sparse_mla(q, kv_cache, slots, kv_lora_rank: int, scale: float, q_rope=None, valid_lens=None,
               block_n: int = 64, stages: int = 2, num_warps: int = 8) -> torch.Tensor:
    """`triton_sparse_mla.sparse_mla`'s contract (one split): q [T, H, 512] with q_rope [T, H, 64] (or q
    [T, H, 576]), kv_cache [N, S, 576], slots [T, K] -> [T, H, 512]."""
    if not supports(q, kv_cache, kv_lora_rank):
        raise ValueError("gluon sparse_mla needs bf16 on sm_90, rank 512 + RoPE 64 and heads a multiple of 64")
    num_tokens, num_heads = q.shape[:2]
    width = kv_cache.shape[-1]
    q, q_rope, kv, slots = operands(q, kv_cache, slots, kv_lora_rank, q_rope)
    out = q.new_empty(num_tokens, num_heads, kv_lora_rank)
    if num_tokens == 0:
        return out
    groups = num_heads // BLOCK_H
    lens = slots if valid_lens is None else valid_lens.to(torch.int32)
    _sparse_mla_wgmma_kernel[(num_tokens * groups,)](
        q, q_rope, kv, slots, lens, out,
        q.stride(0), q.stride(1), q_rope.stride(0), q_rope.stride(1), slots.stride(0), out.stride(0), out.stride(1),
        num_heads, slots.shape[1], width, scale * LOG2E, groups,
        BLOCK_H=BLOCK_H, BLOCK_N=block_n, DV=RANK, DR=ROPE, STAGES=stages, HAS_LENS=valid_lens is not None,
        num_warps=num_warps,
    )
    return out
