"""Skinny GEMMs for decode-sized batches in Triton: y = x W^T and batched a @ b with few rows.

A decode step's projections have 1-64 rows against weights of megabytes, so they are weight reads:
the time is the bytes over the copy rate if enough of them are in flight on every SM. cuBLAS picks
tiles for reuse (on an H200 its kernels read the `small` preset's decode weights at ~30% of the copy
rate at 64 rows, docs/perf/engine-serve-h200.md), so here the grid is sized to the SMs instead:
narrow N tiles, a deep K pipeline and, where N alone gives too few programs, K split over programs
whose fp32 partials the last of a tile's splits to finish sums in split order (an arrival counter,
`arrivals.py`: no second launch, and results stay deterministic).

One row against a weight whose K is contiguous (every projection at batch 1) goes to a GEMV
instead: no tensor cores and no shared memory, each program loads its whole strip of the weight at
once and sums in fp32. On the H200 the tl.dot kernel took ~1.5 DRAM round trips a K tile through its
pipeline; the GEMV took a layer's five projections from 37.8 to 26.5 us (benchmarks/gemv_probe_gpu.py).

Both operands take any strides (a transposed view costs nothing), and the tiles come from shapes
only, so a captured graph keeps them.
"""

import torch
import triton
import triton.language as tl

from rooftop.engine.kernels import pdl
from rooftop.engine.kernels.arrivals import arrive_last, counters, rearm
from rooftop.engine.kernels.pdl import launch_dependents, wait_prior

# The model sends products of up to this many rows here (dispatch.linear / bmm); more rows go to cuBLAS,
# which was as fast or faster at 64 rows on the H200 (docs/perf/engine-serve-h200.md).
MAX_ROWS = 16


# Row and split counts are not specialised on (== 1, multiple of 16): one compile a row tile, so the
# warm-up's prefills cover every decode batch and short prompt.
@triton.jit(do_not_specialize=["M", "num_splits", "stride_os"])
def _matmul_kernel(
    a_ptr, b_ptr, out_ptr, final_ptr, count_ptr, M, N, K, k_per_split, num_splits,
    stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn, stride_ob, stride_os, stride_om, stride_fb,
    stride_fm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
):
    """out[batch, split] tile (BLOCK_M x BLOCK_N) = a[batch] @ b[batch] over this split's K range,
    accumulated in fp32 (stored in out's dtype: the result itself, or a partial; rows stride_om apart).
    With SPLIT_K the last split of the tile to finish sums the partials in split order into
    final[batch] (rows stride_fm apart)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1) // num_splits
    split = tl.program_id(1) % num_splits
    batch = tl.program_id(2).to(tl.int64)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    a_rows = a_ptr + batch * stride_ab + rm[:, None] * stride_am
    b_cols = b_ptr + batch * stride_bb + rn.to(tl.int64)[None, :] * stride_bn
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < k_hi
        a = tl.load(a_rows + rk[None, :] * stride_ak, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_cols + rk[:, None] * stride_bk, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
    tile = rm[:, None] * stride_om + rn[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    out = out_ptr + batch * stride_ob + split.to(tl.int64) * stride_os + tile
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=ok)
    if SPLIT_K:
        tiles_m = tl.num_programs(1) // num_splits
        counter = count_ptr + pid_n + tl.num_programs(0) * (pid_m + tiles_m * tl.program_id(2))
        if arrive_last(counter, num_splits):
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in range(num_splits):  # other SMs wrote these: read through L2
                total += tl.load(out_ptr + batch * stride_ob + s * stride_os.to(tl.int64) + tile, mask=ok, other=0.0,
                                 cache_modifier=".cg")
            final = final_ptr + batch * stride_fb + rm[:, None] * stride_fm + rn[None, :]
            tl.store(final, total.to(final_ptr.dtype.element_ty), mask=ok)
            rearm(counter)


# A GEMV program's share of the weight, in bytes: 8 KB strips won or tied at every K-contiguous
# projection of the `small` preset at one row on the H200 (benchmarks/gemv_probe_gpu.py; 2-row
# strips at K 2048 and 4096, 4 at K 768, 8 at K 512).
GEMV_PROGRAM_BYTES = 8 << 10


@triton.jit
def strip_dot(x_row, w_rows, stride_wk, n_ok, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              PDL: tl.constexpr = False):
    """fp32 [BLOCK_N] = x_row[:K] . a strip of weight rows (w_rows: [1, BLOCK_N] pointers to each row's
    first element, K stride_wk apart). The K chunks are unrolled, so all their loads are issued before
    the first sum. The first chunk's weights are loaded before waiting (with PDL) for the kernel that
    writes x (`pdl.wait_prior`): the whole strip where it is one chunk."""
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k0 in tl.static_range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        w = tl.load(w_rows + k[:, None] * stride_wk, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if k0 == 0:
            wait_prior(PDL)
        x = tl.load(x_row + k, mask=k_ok, other=0.0).to(tl.float32)
        acc += tl.sum(w.to(tl.float32) * x[:, None], axis=0)
    return acc


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, out_ptr, N, stride_xb, stride_wb, stride_wk, stride_wn, stride_ob,
                 K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """out[b, n strip] = x[b, :K] @ w[b, :K, n strip] for one row (`strip_dot`). Launched with PDL, the
    strip's weights load while the kernel before still runs."""
    launch_dependents(PDL)  # a GEMV's next kernel is often a GEMV (W_UV, then o_proj)
    b = tl.program_id(1).to(tl.int64)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    acc = strip_dot(x_ptr + b * stride_xb, w_ptr + b * stride_wb + n.to(tl.int64)[None, :] * stride_wn, stride_wk,
                    n_ok, K, BLOCK_N, BLOCK_K, PDL)
    tl.store(out_ptr + b * stride_ob + n, acc.to(out_ptr.dtype.element_ty), mask=n_ok)


def gemv_config(n: int, k: int, itemsize: int = 2) -> dict:
    """The GEMV's strip width, K chunk and warps from shapes only (see GEMV_PROGRAM_BYTES)."""
    rows = GEMV_PROGRAM_BYTES // (k * itemsize)
    block_n = max(2, min(64, 1 << max(0, rows.bit_length() - 1), triton.next_power_of_2(n)))
    return {"BLOCK_N": block_n, "BLOCK_K": min(triton.next_power_of_2(k), max(16, 8192 // block_n)),
            "num_warps": 8 if k >= 2048 else 4}


def _gemv(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [B, 1, N] = a [B, 1, K] @ b [B, K, N], K contiguous in both."""
    nb, _, k = a.shape
    n = b.shape[2]
    cfg = gemv_config(n, k, b.element_size())
    _gemv_kernel[(triton.cdiv(n, cfg["BLOCK_N"]), nb)](
        a, b, out, n, a.stride(0), b.stride(0), b.stride(1), b.stride(2), out.stride(0),
        K=k, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"], **pdl.args("gemv", a.device))
    return out


def default_config(m: int, n: int, k: int, batch: int = 1, num_sms: int = 132) -> dict:
    """Tiles and K splits from shapes only.

    Up to 16 rows (what the model sends here, see MAX_ROWS), from the H200 sweep of the `small`
    preset's projections (benchmarks/decode_gemms_gpu.py): 32-wide N tiles (64 from 6144 columns),
    512-deep K tiles in 3 stages, and K split in 4 only from 4096 deep. Otherwise: N tiles narrowed,
    then K split, until the grid has about two programs an SM, 3-4 stages within ~160 KB of shared memory.
    """
    if m <= 16 and batch == 1:
        if k >= 4096:
            return {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "splits": 4, "num_warps": 4, "num_stages": 4}
        block_k = min(512, max(16, triton.next_power_of_2(k)))
        return {"BLOCK_M": 16, "BLOCK_N": 64 if n >= 6144 else 32, "BLOCK_K": block_k, "splits": 1,
                "num_warps": 4, "num_stages": 3 if block_k >= 512 else 4}
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    block_k = min(256, max(16, triton.next_power_of_2(k)))
    m_tiles = triton.cdiv(m, block_m) * batch
    target = 2 * num_sms
    block_n = 64
    while block_n > 16 and triton.cdiv(n, block_n) * m_tiles < target:
        block_n //= 2
    splits = 1
    while triton.cdiv(n, block_n) * m_tiles * splits * 2 <= target and k // (splits * 2) >= 2 * block_k:
        splits *= 2
    stage_bytes = (block_m + block_n) * block_k * 2
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "splits": splits,
            "num_warps": 4, "num_stages": max(2, min(4, (160 << 10) // stage_bytes))}


def bmm(a: torch.Tensor, b: torch.Tensor, config: dict | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """a [B, M, K] @ b [B, K, N] -> [B, M, N] (a's dtype), any strides in; torch.bmm's contract. The
    result is new and contiguous, or written into `out` [B, M, N], whose columns must be contiguous
    (its batches and rows may be strided: a transposed view of a [M, B, N] buffer, say).
    One row against a K-contiguous b goes to the GEMV unless a config is given."""
    nb, m, k = a.shape
    n = b.shape[2]
    if b.shape[0] != nb or b.shape[1] != k:
        raise ValueError(f"bmm shapes {tuple(a.shape)} @ {tuple(b.shape)} do not chain")
    if out is None:
        out = a.new_empty(nb, m, n)
    elif tuple(out.shape) != (nb, m, n) or out.dtype != a.dtype or (n > 1 and out.stride(2) != 1):
        raise ValueError(f"bmm out must be [{nb}, {m}, {n}] {a.dtype} with contiguous columns, "
                         f"got {tuple(out.shape)} {out.dtype} strides {out.stride()}")
    if out.numel() == 0:
        return out
    if k == 0:
        return out.zero_()
    if m == 1 and config is None and a.stride(2) == 1 and b.stride(1) == 1:
        return _gemv(a, b, out)
    cfg = config or default_config(m, n, k, nb, _num_sms(a.device))
    bm, bn, bk, splits = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["splits"]
    k_per_split = triton.cdiv(triton.cdiv(k, splits), bk) * bk
    splits = triton.cdiv(k, k_per_split)  # no empty split
    grid = (triton.cdiv(n, bn), triton.cdiv(m, bm) * splits, nb)
    if splits == 1:
        dest, count, stride_ob, stride_os, stride_om = out, out, out.stride(0), 0, out.stride(1)
    else:
        dest = torch.empty(splits, nb, m, n, dtype=torch.float32, device=a.device)
        count = counters(a.device, grid[0] * grid[1] // splits * nb)
        stride_ob, stride_os, stride_om = dest.stride(1), dest.stride(0), n
    # One batch: its strides are never used; 0 keeps row-count-dependent values out of the compile key.
    stride_ab, stride_bb = (a.stride(0), b.stride(0)) if nb > 1 else (0, 0)
    stride_ob, stride_fb = (stride_ob, out.stride(0)) if nb > 1 else (0, 0)
    _matmul_kernel[grid](
        a, b, dest, out, count, m, n, k, k_per_split, splits,
        stride_ab, a.stride(1), a.stride(2), stride_bb, b.stride(1), b.stride(2), stride_ob, stride_os, stride_om,
        stride_fb, out.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=splits > 1, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T -> [..., N]: F.linear without bias."""
    rows = x.reshape(-1, x.shape[-1])
    out = bmm(rows[None], weight.t()[None], config)[0]
    return out.view(*x.shape[:-1], weight.shape[0])


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count
