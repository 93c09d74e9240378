"""Routed SwiGLU experts as a grouped GEMM in Triton: matches `reference.moe_experts`, no host sync.

The (token, expert) pairs are sorted by expert on the device and laid out in blocks of BLOCK_M
rows, each block owned by one expert (a block's unused rows point past the last pair). The grid
is fixed by shapes: enough blocks for the worst case (every expert partly filled); blocks past the
used ones exit at once. Kernel 1: h = silu(x W_gate^T) * (x W_up^T) per block and N tile. Kernel 2:
y = h W_down^T times the routing weight, stored in the pair's own row; a sum over the k pairs of each
token finishes the weighted scatter-add without atomics (so results are deterministic).
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from rooftop.engine.kernels import pdl
from rooftop.engine.kernels.arrivals import arrive_last, counters, rearm
from rooftop.engine.kernels.pdl import launch_dependents, launch_dependents_and_wait, wait_prior
from rooftop.engine.kernels.triton_matmul import strip_dot
from rooftop.engine.kernels.triton_norm_rope import rms_normed


@triton.jit
def _expert_weights(w_ptr, shared_ptr, expert, num_routed_experts, stride_we, HAS_SHARED: tl.constexpr):
    """Base pointer of an expert's weights: the shared expert is expert number num_routed_experts."""
    base = w_ptr + expert.to(tl.int64) * stride_we
    if HAS_SHARED:
        if expert == num_routed_experts:
            base = shared_ptr
    return base


@triton.jit
def _gate_up_kernel(
    x_ptr, w13_ptr, shared_w13_ptr, pair_ptr, block_expert_ptr, h_ptr,
    hidden, inter, top_k, num_pairs, num_routed_pairs, num_experts, num_routed_experts,
    stride_xt, stride_we, stride_wn, stride_ht,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_SHARED: tl.constexpr,
):
    """Pairs past num_routed_pairs are the shared expert's, one a token (pair - num_routed_pairs)."""
    blk = tl.program_id(0)
    n_tile = tl.program_id(1)
    expert = tl.load(block_expert_ptr + blk)
    if expert < num_experts:
        rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(pair_ptr + rows)
        row_ok = pair < num_pairs
        token = tl.where(pair < num_routed_pairs, pair // top_k, pair - num_routed_pairs)
        token = tl.where(row_ok, token, 0)
        n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < inter
        w_base = _expert_weights(w13_ptr, shared_w13_ptr, expert, num_routed_experts, stride_we, HAS_SHARED)
        gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, hidden, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < hidden
            a = tl.load(x_ptr + token[:, None] * stride_xt + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wg = tl.load(w_base + n[None, :] * stride_wn + k[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
            wu = tl.load(w_base + (n + inter)[None, :] * stride_wn + k[:, None], mask=n_ok[None, :] & k_ok[:, None],
                         other=0.0)
            gate = tl.dot(a, wg, gate)
            up = tl.dot(a, wu, up)
        h = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(h_ptr + rows[:, None] * stride_ht + n[None, :], h.to(h_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def _down_kernel(
    h_ptr, w2_ptr, shared_w2_ptr, pair_ptr, block_expert_ptr, topk_w_ptr, y_ptr,
    hidden, inter, num_pairs, num_routed_pairs, num_experts, num_routed_experts,
    stride_ht, stride_we, stride_wn, stride_yt,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_SHARED: tl.constexpr,
):
    blk = tl.program_id(0)
    n_tile = tl.program_id(1)
    expert = tl.load(block_expert_ptr + blk)
    if expert < num_experts:
        rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(pair_ptr + rows)
        row_ok = pair < num_pairs
        n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < hidden
        w_base = _expert_weights(w2_ptr, shared_w2_ptr, expert, num_routed_experts, stride_we, HAS_SHARED)
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < inter
            a = tl.load(h_ptr + rows[:, None] * stride_ht + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_base + n[None, :] * stride_wn + k[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
            acc = tl.dot(a, w, acc)
        # The shared expert's pairs weigh 1.
        route_w = tl.load(topk_w_ptr + pair, mask=row_ok & (pair < num_routed_pairs), other=1.0).to(tl.float32)
        acc = acc * route_w[:, None]
        tl.store(y_ptr + pair.to(tl.int64)[:, None] * stride_yt + n[None, :], acc, mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def _pair_expert(ids_ptr, pair, num_routed_pairs, num_routed_experts, TOP_K: tl.constexpr):
    """(token, expert) of a pair: routed pairs are token * TOP_K + j; the shared expert's (number
    num_routed_experts) follow them, one a token."""
    routed = pair < num_routed_pairs
    token = tl.where(routed, pair // TOP_K, pair - num_routed_pairs)
    expert = tl.load(ids_ptr + pair, mask=routed, other=num_routed_experts)
    return token, expert


@triton.jit
def _gate_up_gemv_kernel(
    x_ptr, w13_ptr, shared_w13_ptr, ids_ptr, h_ptr, inter, num_routed_pairs, num_routed_experts,
    stride_xt, stride_we, stride_wn, stride_ht,
    TOP_K: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_SHARED: tl.constexpr,
    PDL: tl.constexpr,
):
    """h[pair, n strip] = silu(x W_gate^T) * (x W_up^T) for one pair's token and expert: a GEMV."""
    launch_dependents_and_wait(PDL)  # the expert ids, so the weights too, come from the router (`pdl`)
    pair = tl.program_id(1)
    token, expert = _pair_expert(ids_ptr, pair, num_routed_pairs, num_routed_experts, TOP_K)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < inter
    w_base = _expert_weights(w13_ptr, shared_w13_ptr, expert, num_routed_experts, stride_we, HAS_SHARED)
    x_row = x_ptr + token.to(tl.int64) * stride_xt
    gate = strip_dot(x_row, w_base + n[None, :] * stride_wn, 1, n_ok, K, BLOCK_N, BLOCK_K)
    up = strip_dot(x_row, w_base + (n + inter)[None, :] * stride_wn, 1, n_ok, K, BLOCK_N, BLOCK_K)
    h = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(h_ptr + pair * stride_ht + n, h.to(h_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _pairs_chunk(h_ptr, base, pair, live, n, n_ok, stride_ht, stride_wn, k0, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 [pairs, strip]: each pair's W_down strip (rows n of the expert at `base`) times its h row,
    over K columns [k0, k0 + BLOCK_K)."""
    k = k0 + tl.arange(0, BLOCK_K)
    k_ok = k < K
    w = tl.load(base[:, None, None] + n[None, :, None] * stride_wn + k[None, None, :],
                mask=live[:, None, None] & n_ok[None, :, None] & k_ok[None, None, :], other=0.0)
    rows = tl.load(h_ptr + pair[:, None] * stride_ht + k[None, :], mask=live[:, None] & k_ok[None, :], other=0.0)
    return tl.sum(w.to(tl.float32) * rows.to(tl.float32)[:, None, :], axis=2)


@triton.jit
def _down_gemv_kernel(
    h_ptr, w2_ptr, shared_w2_ptr, ids_ptr, topk_w_ptr, shared_ptr, res_ptr, out_ptr, norm_w_ptr, normed_ptr,
    count_ptr, hidden, num_tokens, stride_ht, stride_we, stride_wn, stride_s, stride_r, eps,
    TOP_K: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr,
    SHARED_PAIR: tl.constexpr, HAS_SHARED: tl.constexpr, HAS_RESIDUAL: tl.constexpr, NORM: tl.constexpr,
    BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):
    """out[t, n strip] for every token: all of its pairs' W_down strips in one load ([pairs, strip, K
    chunk]; the chunks unrolled, one at the `small` preset's shapes), each pair's GEMV times its routing
    weight, summed over the pairs, then the shared expert and the residual (`_combined`, as
    `_combine_kernel`). With NORM the last program to finish (an arrival counter) norms every token's
    whole row: the combine kernel's launch goes."""
    launch_dependents_and_wait(PDL)  # the next layer's first GEMV (`pdl`)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < hidden
    p = tl.arange(0, BLOCK_P)
    routed = p < TOP_K
    is_shared = (p == TOP_K) & SHARED_PAIR
    num_routed_pairs = num_tokens * TOP_K
    dtype = out_ptr.dtype.element_ty
    for t in range(num_tokens):
        pair = tl.where(routed, t * TOP_K + p, num_routed_pairs + t)
        live = routed | is_shared
        expert = tl.load(ids_ptr + pair, mask=routed, other=0)
        base = tl.where(is_shared, shared_w2_ptr, w2_ptr + expert.to(tl.int64) * stride_we)  # [P] pointers
        y = _pairs_chunk(h_ptr, base, pair, live, n, n_ok, stride_ht, stride_wn, 0, K, BLOCK_K)  # [P, N]
        for k0 in tl.static_range(BLOCK_K, K, BLOCK_K):
            y += _pairs_chunk(h_ptr, base, pair, live, n, n_ok, stride_ht, stride_wn, k0, K, BLOCK_K)
        route_w = tl.load(topk_w_ptr + pair, mask=routed, other=0.0).to(tl.float32)
        acc = tl.sum(y * route_w[:, None], axis=0)
        shared_y = tl.sum(tl.where(is_shared[:, None], y, 0.0), axis=0)
        out = _combined(acc, shared_y, shared_ptr, res_ptr, t, n, n_ok, stride_s, stride_r, dtype,
                        SHARED_PAIR, HAS_SHARED, HAS_RESIDUAL)
        tl.store(out_ptr + t * hidden + n, out, mask=n_ok)
    if NORM:
        if arrive_last(count_ptr, tl.num_programs(0)):
            d = tl.arange(0, BLOCK_D)
            ok = d < hidden
            for t in range(num_tokens):  # other SMs wrote these rows: read through L2
                row = tl.load(out_ptr + t * hidden + d, mask=ok, other=0.0, cache_modifier=".cg")
                tl.store(normed_ptr + t * hidden + d, rms_normed(row, norm_w_ptr, d, ok, hidden, eps).to(dtype), mask=ok)
            rearm(count_ptr)


# Up to this many tokens the experts run as GEMVs (`_gate_up_gemv_kernel`, `_down_gemv_kernel`): one
# program a pair and strip of W_gate/W_up, one a strip of W_down over every pair, no pair layout and
# no combine kernel (two launches a layer instead of three, and the router lays out no pairs). On the
# H200 the graphed C=1 step of the `small` preset took 1.136 ms against 1.253 with the grouped GEMM
# (benchmarks/decode_ab_gpu.py, one process; docs/perf/engine-serve-h200.md).
GEMV_MAX_TOKENS = 1
# A program's share of the weights in bytes: gate and up rows of one pair; every pair's down rows.
GATE_UP_PROGRAM_BYTES = 16 << 10
DOWN_PROGRAM_BYTES = 16 << 10
# A down program's weight tile [pairs (a power of 2), strip, K chunk] in elements at most: wider
# experts or more pairs (DeepSeek-V3: top-8 + shared, 2048 wide) take K in chunks instead of spilling.
DOWN_TILE_ELEMENTS = 8192


def gemv_takes(num_tokens: int, element_size: int = 2) -> bool:
    """Whether `moe_experts` runs num_tokens' experts as GEMVs (16-bit weights: fp32 ones stay in the
    grouped GEMM, whose tiles the tests pin)."""
    return 0 < num_tokens <= GEMV_MAX_TOKENS and element_size <= 2


def _strip_rows(row_bytes: int, program_bytes: int, n: int) -> int:
    """Rows of a GEMV strip (a power of 2, 1-64, at most n's next power of 2) within program_bytes."""
    rows = max(1, program_bytes // row_bytes)
    return min(64, 1 << (rows.bit_length() - 1), triton.next_power_of_2(n))


class _Epilogue(NamedTuple):
    """What the last kernel of `moe_experts` adds and writes: the output (and its next norm), the shared
    expert's output and the residual (the output's own buffer, with stride 0, where absent)."""

    out: torch.Tensor
    normed: torch.Tensor
    norm_w: torch.Tensor
    eps: float
    shared: torch.Tensor
    residual: torch.Tensor
    stride_s: int
    stride_r: int
    has_shared: bool
    has_residual: bool
    norm: bool

    def result(self) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return (self.out, self.normed) if self.norm else self.out


def _epilogue(x: torch.Tensor, shared: torch.Tensor | None, residual: torch.Tensor | None,
              next_norm: tuple[torch.Tensor, float] | None) -> _Epilogue:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    normed = torch.empty_like(out) if next_norm is not None else out
    norm_w, eps = next_norm if next_norm is not None else (out, 0.0)
    shared = shared if shared is None or shared.stride(-1) == 1 else shared.contiguous()
    residual = residual if residual is None or residual.stride(-1) == 1 else residual.contiguous()
    return _Epilogue(out, normed, norm_w, eps, out if shared is None else shared,
                     out if residual is None else residual, 0 if shared is None else shared.stride(0),
                     0 if residual is None else residual.stride(0), shared is not None, residual is not None,
                     next_norm is not None)


def _moe_gemv(x, topk_ids, topk_weights, w13, w2, s13, s2, fold, shared, residual, next_norm):
    """`moe_experts` for a few tokens as two GEMV kernels (see GEMV_MAX_TOKENS)."""
    num_tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    num_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    num_routed = num_tokens * top_k
    num_pairs = num_routed + (num_tokens if fold else 0)
    ids = topk_ids.reshape(-1).contiguous()
    route_w = topk_weights.reshape(-1).float().contiguous()
    h = torch.empty(num_pairs, inter, dtype=x.dtype, device=x.device)
    bn = _strip_rows(2 * hidden * w13.element_size(), GATE_UP_PROGRAM_BYTES, inter)
    _gate_up_gemv_kernel[(triton.cdiv(inter, bn), num_pairs)](
        x, w13, s13, ids, h, inter, num_routed, num_experts, x.stride(0), w13.stride(0), w13.stride(1), h.stride(0),
        TOP_K=top_k, K=hidden, BLOCK_N=bn, BLOCK_K=min(triton.next_power_of_2(hidden), max(16, 8192 // bn)),
        HAS_SHARED=fold, num_warps=8 if hidden >= 2048 else 4, **pdl.args("experts", x.device, num_tokens),
    )
    e = _epilogue(x, shared, residual, next_norm)
    # A down program reads every pair's strip at once.
    block_p = triton.next_power_of_2(top_k + fold)
    bn = _strip_rows((top_k + fold) * inter * w2.element_size(), DOWN_PROGRAM_BYTES, hidden)
    _down_gemv_kernel[(triton.cdiv(hidden, bn),)](
        h, w2, s2, ids, route_w, e.shared, e.residual, e.out, e.norm_w, e.normed, counters(x.device, 1), hidden,
        num_tokens, h.stride(0), w2.stride(0), w2.stride(1), e.stride_s, e.stride_r, e.eps,
        TOP_K=top_k, K=inter, BLOCK_N=bn,
        BLOCK_K=min(triton.next_power_of_2(inter), max(16, DOWN_TILE_ELEMENTS // (block_p * bn))),
        BLOCK_P=block_p, SHARED_PAIR=fold, HAS_SHARED=e.has_shared, HAS_RESIDUAL=e.has_residual, NORM=e.norm,
        BLOCK_D=triton.next_power_of_2(hidden), num_warps=4, **pdl.args("experts", x.device, num_tokens),
    )
    return e.result()


# Decode is weight-bound: enough weight bytes in flight per SM matters more than tile reuse.
DEFAULT_CONFIG = {"BLOCK_M": 16, "BLOCK_N1": 64, "BLOCK_K1": 64, "warps1": 4, "stages1": 3,
                  "BLOCK_N2": 64, "BLOCK_K2": 64, "warps2": 4, "stages2": 3}
# Up to this many tokens only a few experts' blocks have rows, whose weights want deeper K tiles and
# more stages in flight: at one token on the H200 the gate/up kernel took 140 us a step instead of 290,
# and the down kernel 95 instead of 107 (tiles from benchmarks/decode_gemms_gpu.py's sweep).
FEW_TOKENS = 8
FEW_TOKENS_CONFIG = {"BLOCK_N1": 32, "BLOCK_K1": 256, "stages1": 4, "BLOCK_N2": 64, "BLOCK_K2": 128, "stages2": 4}


def default_config(num_tokens: int, element_size: int = 2) -> dict:
    """Tiles from the token count and the weights' element size alone (so a captured graph keeps them);
    the few-token tiles are sized for 16-bit weights (fp32 ones would ask for ~240 KB of shared memory)."""
    few = num_tokens <= FEW_TOKENS and element_size <= 2
    return {**DEFAULT_CONFIG, **(FEW_TOKENS_CONFIG if few else {})}


# Above this many pair x expert elements the pairs are sorted instead of one-hot counted.
ONE_HOT_ELEMENTS = 1 << 22


# The one-program layout kernel holds a [pairs, experts] one-hot in registers: up to this many elements.
ALIGN_KERNEL_ELEMENTS = 1 << 14
# Up to this many pairs it is compiled for this many.
ALIGN_FEW_PAIRS = 64
# Past ALIGN_FEW_PAIRS, for the next power of two of the pairs (one compile a tier, each reached by a
# decode graph or the runner's warm-up prefills) rather than for ALIGN_KERNEL_ELEMENTS / experts: the
# kernel's time follows its one-hot's size. The `small` preset's graphed step on the H200, one process
# (decode_ab_gpu.py, context 288; docs/perf/engine-serve-h200.md): C=16 (80 pairs of 33 experts: a
# [128, 64] one-hot, not [256, 64]) x0.985 [0.968, 1.026], C=32 x0.984 [0.978, 1.015], C=64 (256 pairs
# of 32: [256, 32], not [512, 32]) x0.987 [0.980, 0.994]; the same logits bit for bit.
ALIGN_TIERS = True


@triton.jit
def _align_pairs(
    ids_ptr, pair_of_row_ptr, block_expert_ptr, num_pairs, num_routed_pairs, num_experts, max_blocks,
    BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_B: tl.constexpr,
):
    """One program: each pair's rank within its expert from a one-hot cumsum, experts' padded
    ranges, the row of each pair, and each block's expert (== num_experts past the used blocks).
    Pairs from num_routed_pairs on belong to the last expert (the shared one, where there is one).
    The ids are read through L2 (.cg): in the router's kernel other SMs wrote them."""
    p = tl.arange(0, BLOCK_P)
    p_ok = p < num_pairs
    e = tl.arange(0, BLOCK_E)
    expert = tl.load(ids_ptr + p, mask=p < num_routed_pairs, other=num_experts - 1, cache_modifier=".cg").to(tl.int32)
    expert = tl.where(p_ok, expert, -1)
    hot = (expert[:, None] == e[None, :]).to(tl.int32)  # [P, E]
    rank = tl.sum(tl.cumsum(hot, axis=0) * hot, axis=1) - 1
    counts = tl.sum(hot, axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, axis=0)
    dest = tl.sum(hot * (padded_end - padded)[None, :], axis=1) + rank
    for r0 in range(0, max_blocks * BLOCK_M, BLOCK_P):
        r = r0 + p
        tl.store(pair_of_row_ptr + r, tl.zeros([BLOCK_P], tl.int64) + num_pairs, mask=r < max_blocks * BLOCK_M)
    tl.debug_barrier()  # the fill above lands before the scatter below (one program, many threads)
    tl.store(pair_of_row_ptr + dest, p.to(tl.int64), mask=p_ok)
    b = tl.arange(0, BLOCK_B)
    ended = (padded_end[None, :] <= (b * BLOCK_M)[:, None]) & (e < num_experts)[None, :]
    tl.store(block_expert_ptr + b, tl.sum(ended.to(tl.int64), axis=1), mask=b < max_blocks)


@triton.jit
def _align_kernel(
    ids_ptr, pair_of_row_ptr, block_expert_ptr, num_pairs, num_routed_pairs, num_experts, max_blocks,
    BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_B: tl.constexpr,
):
    _align_pairs(ids_ptr, pair_of_row_ptr, block_expert_ptr, num_pairs, num_routed_pairs, num_experts, max_blocks,
                 BLOCK_M, BLOCK_P, BLOCK_E, BLOCK_B)


class _Layout(NamedTuple):
    """Sizes of a pair layout (`align_pairs`), from shapes only."""

    num_routed: int
    num_pairs: int
    max_blocks: int
    block_e: int
    block_p: int
    block_b: int
    warps: int

    @property
    def one_program(self) -> bool:
        """Whether the one-program layout kernel takes these pairs (else ~15 torch ops do)."""
        return 0 < self.num_pairs <= self.block_p

    def buffers(self, block_m: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(pair of each padded row, expert of each block), unfilled."""
        return (torch.empty(self.max_blocks * block_m, dtype=torch.long, device=device),
                torch.empty(self.max_blocks, dtype=torch.long, device=device))


def _layout(num_tokens: int, top_k: int, num_experts: int, block_m: int, shared: bool) -> _Layout:
    """The sizes `align_pairs` lays num_tokens x top_k pairs (and one shared pair a token) out with."""
    num_routed = num_tokens * top_k
    num_pairs = num_routed + (num_tokens if shared else 0)
    block_e = triton.next_power_of_2(num_experts)
    # At most ALIGN_KERNEL_ELEMENTS / experts pairs; below that a few sizes only (64 pairs, then a power
    # of two of them: ALIGN_TIERS), each compiled before serving by a decode graph's capture or the
    # runner's warm-up prefills (ModelRunner.WARM_UP_CHUNKS), not mid-serving.
    block_p = ALIGN_KERNEL_ELEMENTS // block_e
    if num_pairs <= ALIGN_FEW_PAIRS:
        block_p = min(block_p, ALIGN_FEW_PAIRS)  # decode at small batch: a [64, E] one-hot, not [512, E]
    elif ALIGN_TIERS:
        block_p = min(block_p, triton.next_power_of_2(num_pairs))
    return _Layout(num_routed, num_pairs, triton.cdiv(num_pairs, block_m) + num_experts, block_e, block_p,
                   triton.next_power_of_2(triton.cdiv(block_p, block_m) + num_experts),
                   4 if block_p <= ALIGN_FEW_PAIRS else 8)


def fold_fits(num_tokens: int, top_k: int, num_experts: int) -> bool:
    """Whether num_tokens' routed pairs plus one shared pair each fit the one-program layout kernel
    with the shared expert as one more expert (its one-hot is next_power_of_2(E + 1) wide: at 256
    experts, top-8, that is 512 columns and 32 pairs)."""
    return 0 < num_tokens * (top_k + 1) <= ALIGN_KERNEL_ELEMENTS // triton.next_power_of_2(num_experts + 1)


def align_pairs(topk_ids: torch.Tensor, num_experts: int, block_m: int,
                shared: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort (token, expert) pairs by expert into blocks of `block_m` rows, on the device.

    -> (pair index per padded row [max_blocks * block_m], num_pairs where unused;
        expert per block [max_blocks], num_experts where unused). Sizes depend on shapes only.
    With `shared`, each token has one more pair (T * k + token) with expert number num_experts - 1.
    """
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    sizes = _layout(topk_ids.shape[0], topk_ids.shape[1] if topk_ids.dim() == 2 else 1, num_experts, block_m, shared)
    num_routed, num_pairs, max_blocks = sizes.num_routed, sizes.num_pairs, sizes.max_blocks
    if sizes.one_program:
        # Decode and small prefills: one small kernel instead of ~15 torch ops.
        pair_of_row, block_expert = sizes.buffers(block_m, device)
        _align_kernel[(1,)](
            flat, pair_of_row, block_expert, num_pairs, num_routed, num_experts, max_blocks,
            BLOCK_M=block_m, BLOCK_P=sizes.block_p, BLOCK_E=sizes.block_e, BLOCK_B=sizes.block_b,
            num_warps=sizes.warps,
        )
        return pair_of_row, block_expert
    if shared:
        flat = torch.cat([flat, flat.new_full((num_pairs - num_routed,), num_experts - 1)])
    if num_pairs * num_experts <= ONE_HOT_ELEMENTS:
        # Decode: each pair's rank among its expert's pairs from a one-hot cumsum (a sort costs more).
        # [E, pairs], scanned along the inner dim: the outer-dim scan of [pairs, E] took ~47 us on an H200.
        one_hot = (torch.arange(num_experts, device=device)[:, None] == flat[None, :]).int()
        rank = (one_hot.cumsum(1) - 1).gather(0, flat[None, :]).squeeze(0)
        counts = one_hot.sum(1)
        pair = torch.arange(num_pairs, device=device)
        expert_of = flat
    else:
        pair = flat.argsort(stable=True)
        expert_of = flat[pair]
        # scatter_add_ rather than bincount: bincount sizes its output from the max, a host sync.
        counts = torch.zeros(num_experts, dtype=torch.long, device=device).scatter_add_(0, flat, torch.ones_like(flat))
        rank = torch.arange(num_pairs, device=device) - (counts.cumsum(0) - counts)[expert_of]
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    dest = (padded_end - padded)[expert_of] + rank
    pair_of_row = torch.full((max_blocks * block_m,), num_pairs, dtype=torch.long, device=device)
    pair_of_row.scatter_(0, dest, pair)
    block_start = torch.arange(max_blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end, block_start, right=True)  # == num_experts past the end
    return pair_of_row, block_expert


@triton.jit
def _combined(routed, shared_y, shared_ptr, res_ptr, t, d, ok, stride_s, stride_r, dtype,
              SHARED_PAIR: tl.constexpr, HAS_SHARED: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """One token's output lanes d: the routed pairs' fp32 sum, then the shared expert (its own fp32
    product `shared_y` with SHARED_PAIR, or its output at shared_ptr), then the residual, rounded to
    `dtype` after each step as the reference's torch ops are."""
    out = routed.to(dtype)
    if SHARED_PAIR:
        out = (out.to(tl.float32) + shared_y.to(dtype).to(tl.float32)).to(dtype)
    if HAS_SHARED:
        out = (out.to(tl.float32) + tl.load(shared_ptr + t * stride_s + d, mask=ok, other=0.0).to(tl.float32)).to(dtype)
    if HAS_RESIDUAL:
        out = (tl.load(res_ptr + t * stride_r + d, mask=ok, other=0.0).to(tl.float32) + out.to(tl.float32)).to(dtype)
    return out


@triton.jit
def _combine_kernel(
    y_ptr, shared_ptr, res_ptr, out_ptr, norm_w_ptr, normed_ptr, hidden, stride_s, stride_r, num_routed_pairs, eps,
    TOP_K: tl.constexpr, HAS_SHARED: tl.constexpr, SHARED_PAIR: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    NORM: tl.constexpr, BLOCK: tl.constexpr,
):
    """out[t] = residual[t] + (sum_j y[t, j] + shared[t]), rounded to the output dtype after each
    step as the reference's torch ops are. With SHARED_PAIR the shared expert's output is y's row
    num_routed_pairs + t (rounded to the output dtype first, as its own GEMM's output would be).
    With NORM, also normed[t] = rms_norm(out[t]) (the next layer's input norm)."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK)
    ok = d < hidden
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(y_ptr + (t * TOP_K + j) * hidden + d, mask=ok, other=0.0)
    shared_y = acc
    if SHARED_PAIR:
        shared_y = tl.load(y_ptr + (num_routed_pairs + t) * hidden + d, mask=ok, other=0.0)
    dtype = out_ptr.dtype.element_ty
    out = _combined(acc, shared_y, shared_ptr, res_ptr, t, d, ok, stride_s, stride_r, dtype,
                    SHARED_PAIR, HAS_SHARED, HAS_RESIDUAL)
    tl.store(out_ptr + t * hidden + d, out, mask=ok)
    if NORM:
        tl.store(normed_ptr + t * hidden + d, rms_normed(out, norm_w_ptr, d, ok, hidden, eps).to(dtype), mask=ok)


def moe_experts(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    config: dict | None = None,
    shared: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    shared_w13: torch.Tensor | None = None,
    shared_w2: torch.Tensor | None = None,
    next_norm: tuple[torch.Tensor, float] | None = None,
    layout: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `reference.moe_experts`: x [T, Hd], ids/weights [T, k], w13 [E, 2I, Hd], w2 [E, Hd, I];
    the k pairs' sum, `+ shared` and `residual +` in one last kernel.

    With `shared_w13` [2I, Hd] and `shared_w2` [Hd, I] (a shared expert of the routed experts' width)
    the shared expert runs in the same two kernels, as one more expert every token picks with weight 1.
    With `next_norm` (weight, eps) the last kernel also norms the output: -> (out, rms_norm(out)).
    `layout` is the pairs' layout `route_and_layout` made for these ids (the same experts counted and
    `shared` as the shared weights given here); else it is made here.

    `config` overrides `default_config`'s tiles (benchmarks sweep them).
    """
    fold = shared_w13 is not None
    if fold and (shared is not None or shared_w2 is None or shared_w13.shape != w13.shape[1:]
                 or shared_w2.shape != w2.shape[1:] or not shared_w13.dtype == shared_w2.dtype == w13.dtype):
        raise ValueError("moe_experts: shared_w13/shared_w2 need each other, the routed experts' shapes and "
                         "dtype, and no `shared` output")
    num_tokens, hidden = x.shape
    cfg = {**default_config(num_tokens, w13.element_size()), **(config or {})}
    block_m = cfg["BLOCK_M"]
    top_k = topk_ids.shape[1]
    num_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    if num_tokens == 0:
        out = torch.zeros_like(x) if residual is None else residual.clone()
        return out if next_norm is None else (out, torch.empty_like(out))
    x = x.contiguous()
    w13 = w13.contiguous()
    w2 = w2.contiguous()
    s13 = shared_w13.contiguous() if fold else w13
    s2 = shared_w2.contiguous() if fold else w2
    if config is None and gemv_takes(num_tokens, w13.element_size()):
        return _moe_gemv(x, topk_ids, topk_weights, w13, w2, s13, s2, fold, shared, residual, next_norm)
    num_routed = num_tokens * top_k
    num_pairs = num_routed + (num_tokens if fold else 0)
    all_experts = num_experts + (1 if fold else 0)  # the shared expert is number num_experts
    if layout is None:
        pair_of_row, block_expert = align_pairs(topk_ids, all_experts, block_m, shared=fold)
    else:
        pair_of_row, block_expert = layout
        sizes = _layout(num_tokens, top_k, all_experts, block_m, fold)
        if block_expert.numel() != sizes.max_blocks or pair_of_row.numel() != sizes.max_blocks * block_m:
            raise ValueError("moe_experts: the layout given was made for other experts, tiles or shared expert")
    max_blocks = block_expert.numel()
    route_w = topk_weights.reshape(-1).float().contiguous()
    h = torch.empty(max_blocks * block_m, inter, dtype=x.dtype, device=x.device)
    y = torch.empty(num_pairs, hidden, dtype=torch.float32, device=x.device)
    bn1, bn2 = cfg["BLOCK_N1"], cfg["BLOCK_N2"]
    _gate_up_kernel[(max_blocks, triton.cdiv(inter, bn1))](
        x, w13, s13, pair_of_row, block_expert, h,
        hidden, inter, top_k, num_pairs, num_routed, all_experts, num_experts,
        x.stride(0), w13.stride(0), w13.stride(1), h.stride(0),
        BLOCK_M=block_m, BLOCK_N=bn1, BLOCK_K=cfg["BLOCK_K1"], HAS_SHARED=fold,
        num_warps=cfg["warps1"], num_stages=cfg["stages1"],
    )
    _down_kernel[(max_blocks, triton.cdiv(hidden, bn2))](
        h, w2, s2, pair_of_row, block_expert, route_w, y,
        hidden, inter, num_pairs, num_routed, all_experts, num_experts,
        h.stride(0), w2.stride(0), w2.stride(1), y.stride(0),
        BLOCK_M=block_m, BLOCK_N=bn2, BLOCK_K=cfg["BLOCK_K2"], HAS_SHARED=fold,
        num_warps=cfg["warps2"], num_stages=cfg["stages2"],
    )
    e = _epilogue(x, shared, residual, next_norm)
    _combine_kernel[(num_tokens,)](
        y, e.shared, e.residual, e.out, e.norm_w, e.normed, hidden, e.stride_s, e.stride_r, num_routed, e.eps,
        TOP_K=top_k, HAS_SHARED=e.has_shared, SHARED_PAIR=fold, HAS_RESIDUAL=e.has_residual, NORM=e.norm,
        BLOCK=triton.next_power_of_2(hidden), num_warps=4,
    )
    return e.result()


@triton.jit
def _route_kernel(
    x_ptr, w_ptr, part_ptr, count_ptr, weights_ptr, ids_ptr, hidden, num_experts, stride_x, stride_w, scaling,
    pair_of_row_ptr, block_expert_ptr, num_tokens, num_pairs, layout_experts, max_blocks,
    TOP_K: tl.constexpr, SIGMOID: tl.constexpr, NORM_TOPK: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_TOPK: tl.constexpr,
    LAYOUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_LE: tl.constexpr,
    BLOCK_B: tl.constexpr, PDL: tl.constexpr,
):
    """Partial gate logits of one token over one chunk of the hidden dim (fp32 products and sums);
    the token's last chunk to finish then selects (an arrival counter: one launch for the router).
    With LAYOUT, the last token to be selected then lays out every token's pairs for the experts'
    kernels (`_align_pairs`; a second counter, after the tokens'): the layout kernel's launch goes."""
    launch_dependents(PDL)
    t = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    chunks = tl.num_programs(1)
    e = tl.arange(0, BLOCK_E)
    k = chunk * BLOCK_K + tl.arange(0, BLOCK_K)
    k_ok = k < hidden
    b = tl.load(w_ptr + e[:, None] * stride_w + k[None, :], mask=(e < num_experts)[:, None] & k_ok[None, :],
                other=0.0)
    wait_prior(PDL)  # the gate's weights load while the kernel before runs (`pdl`); x is its output
    a = tl.load(x_ptr + t * stride_x + k, mask=k_ok, other=0.0).to(tl.float32)
    tl.store(part_ptr + (t * chunks + chunk) * BLOCK_E + e, tl.sum(b.to(tl.float32) * a[None, :], axis=1))
    counter = count_ptr + t
    if arrive_last(counter, chunks):
        _route_select(part_ptr, weights_ptr, ids_ptr, t, num_experts, chunks, scaling,
                      TOP_K, SIGMOID, NORM_TOPK, BLOCK_E, BLOCK_C, BLOCK_TOPK)
        rearm(counter)
        if LAYOUT:
            selected = count_ptr + num_tokens
            if arrive_last(selected, num_tokens):
                _align_pairs(ids_ptr, pair_of_row_ptr, block_expert_ptr, num_pairs, num_tokens * TOP_K,
                             layout_experts, max_blocks, BLOCK_M, BLOCK_P, BLOCK_LE, BLOCK_B)
                rearm(selected)


@triton.jit
def _route_select(
    part_ptr, weights_ptr, ids_ptr, t, num_experts, chunks, scaling,
    TOP_K: tl.constexpr, SIGMOID: tl.constexpr, NORM_TOPK: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_TOPK: tl.constexpr,
):
    """One token: the logits (partials summed in a fixed order, read through L2: other SMs wrote
    them), scores, top-k by repeated max (lowest id on a tie), renormalisation, scaling."""
    e = tl.arange(0, BLOCK_E)
    c = tl.arange(0, BLOCK_C)
    e_ok = e < num_experts
    parts = tl.load(part_ptr + (t * chunks + c)[:, None] * BLOCK_E + e[None, :], mask=(c < chunks)[:, None], other=0.0,
                    cache_modifier=".cg")
    logits = tl.sum(parts, axis=0)
    if SIGMOID:
        scores = 1.0 / (1.0 + tl.exp(-logits))
    else:
        z = tl.exp(tl.where(e_ok, logits, float("-inf")) - tl.max(tl.where(e_ok, logits, float("-inf")), axis=0))
        scores = z / tl.sum(z, axis=0)
    scores = tl.where(e_ok, scores, -1.0)  # below every sigmoid/softmax score
    j = tl.arange(0, BLOCK_TOPK)
    top_w = tl.zeros([BLOCK_TOPK], tl.float32)
    top_i = tl.zeros([BLOCK_TOPK], tl.int64)
    for n in tl.static_range(TOP_K):
        best = tl.max(scores, axis=0)
        arg = tl.min(tl.where(scores == best, e, BLOCK_E), axis=0)
        top_w = tl.where(j == n, best, top_w)
        top_i = tl.where(j == n, arg.to(tl.int64), top_i)
        scores = tl.where(e == arg, -2.0, scores)
    if NORM_TOPK:
        top_w = top_w / tl.sum(top_w, axis=0)
    tl.store(weights_ptr + t * TOP_K + j, top_w * scaling, mask=j < TOP_K)
    tl.store(ids_ptr + t * TOP_K + j, top_i, mask=j < TOP_K)


# The router kernel keeps [experts, k-chunk] products in registers: experts up to this many.
ROUTE_MAX_EXPERTS = 64


def route(
    x: torch.Tensor, gate_weight: torch.Tensor, top_k: int, scoring: str, norm_topk_prob: bool, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `reference.route`, in one kernel: partial logits over chunks of the hidden dim
    (many programs, so the gate weight streams in parallel), then, in each token's last chunk to
    finish, scores, top-k and renormalisation."""
    weights, ids, _ = route_and_layout(x, gate_weight, top_k, scoring, norm_topk_prob, scaling)
    return weights, ids


def route_and_layout(
    x: torch.Tensor, gate_weight: torch.Tensor, top_k: int, scoring: str, norm_topk_prob: bool, scaling: float,
    layout_experts: int | None = None, shared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """`route`, and where asked (`layout_experts`: the experts `moe_experts` will count, the shared one
    included with `shared`) the pairs' layout for `moe_experts`, made in the same kernel where the
    small layout kernel (up to ALIGN_FEW_PAIRS pairs) would take the pairs and the experts are not
    GEMVs (`gemv_takes`, which need none): -> (weights, ids, layout or None). Past that the layout's
    own kernel is quicker than the router's last program: on the H200 at 64 tokens (256 pairs) the
    fused router took 12.7 us a layer against 5.1 + 6.2 for the two."""
    from rooftop.engine.kernels import reference

    num_tokens, hidden = x.shape
    num_experts = gate_weight.shape[0]
    if num_experts > ROUTE_MAX_EXPERTS or x.stride(-1) != 1:
        return (*reference.route(x, gate_weight, top_k, scoring, norm_topk_prob, scaling), None)
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.long, device=x.device)
    block_m = default_config(num_tokens, x.element_size())["BLOCK_M"]
    sizes = _layout(num_tokens, top_k, layout_experts, block_m, shared) if layout_experts else None
    fused = (sizes is not None and sizes.one_program and sizes.block_p <= ALIGN_FEW_PAIRS
             and not gemv_takes(num_tokens, x.element_size()))
    layout = sizes.buffers(block_m, x.device) if fused else None
    if num_tokens:
        block_e = max(2, triton.next_power_of_2(num_experts))
        block_k = min(triton.next_power_of_2(hidden), 8192 // block_e)
        chunks = triton.cdiv(hidden, block_k)
        part = torch.empty(num_tokens, chunks, block_e, dtype=torch.float32, device=x.device)
        gate = gate_weight.contiguous()
        early = gate_weight.is_contiguous()  # else a copy just wrote the gate (`pdl.args`)
        _route_kernel[(num_tokens, chunks)](
            x, gate, part, counters(x.device, num_tokens + 1), weights, ids, hidden, num_experts,
            x.stride(0), hidden, float(scaling),
            *(layout if fused else (ids, ids)), num_tokens, sizes.num_pairs if fused else 0,
            layout_experts if fused else 0, sizes.max_blocks if fused else 0,
            TOP_K=top_k, SIGMOID=scoring == "sigmoid", NORM_TOPK=norm_topk_prob, BLOCK_E=block_e, BLOCK_K=block_k,
            BLOCK_C=max(2, triton.next_power_of_2(chunks)), BLOCK_TOPK=max(2, triton.next_power_of_2(top_k)),
            LAYOUT=fused, BLOCK_M=block_m, BLOCK_P=sizes.block_p if fused else 2,
            BLOCK_LE=sizes.block_e if fused else 2, BLOCK_B=sizes.block_b if fused else 2,
            num_warps=sizes.warps if fused else 4, **pdl.args("router", x.device, num_tokens, early=early),
        )
    return weights, ids, layout
