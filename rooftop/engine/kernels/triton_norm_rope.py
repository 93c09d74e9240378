"""RMSNorm, RoPE, the cache-row write and SwiGLU's activation in Triton: one kernel where the torch reference takes 5-20.

Each matches its function in `reference.py` (same float32 arithmetic, same bf16 rounding points), so
the decode step they sit in launches a few kernels per layer instead of ~150 small ones. All take
rows with any row stride and a unit stride along the last dim.
"""

import torch
import triton
import triton.language as tl

from rooftop.engine.kernels import pdl
from rooftop.engine.kernels.pdl import launch_dependents, launch_dependents_and_wait, wait_prior


@triton.jit
def rms_normed(x, w_ptr, d, ok, dim, eps):
    """One row's rms_norm in fp32 (as `reference.rms_norm`): x [BLOCK] (masked lanes 0), the weight's
    lanes d (ok within dim). The caller rounds and stores it."""
    x32 = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(x32 * x32, axis=0) / dim + eps)
    return x32 * inv * tl.load(w_ptr + d, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _rms_norm_row(
    row, x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr,
    stride_x, stride_r, stride_o, stride_s, dim, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    d = tl.arange(0, BLOCK)
    ok = d < dim
    x = tl.load(x_ptr + row * stride_x + d, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + d, mask=ok, other=0.0)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(sum_ptr.dtype.element_ty)  # rounded as torch's add
        tl.store(sum_ptr + row * stride_s + d, x, mask=ok)
    tl.store(out_ptr + row * stride_o + d, rms_normed(x, w_ptr, d, ok, dim, eps).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr,
    stride_x, stride_r, stride_o, stride_s, dim, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    launch_dependents_and_wait(PDL)  # the next kernel may be a GEMV (`pdl`)
    _rms_norm_row(tl.program_id(0).to(tl.int64), x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr,
                  stride_x, stride_r, stride_o, stride_s, dim, eps, HAS_RESIDUAL, BLOCK)


# Sequences a step_inputs program compares at once (a loop covers more): fixed, so no batch size compiles anew.
_STEP_SEQS = 128


@triton.jit(do_not_specialize=["num_seqs"])
def _step_inputs_kernel(
    ids_ptr, pos_ptr, cu_ptr, emb_ptr, w_ptr, inv_ptr, x_ptr, h_ptr, cos_ptr, sin_ptr, seq_ptr, valid_ptr,
    stride_e, dim, half, num_seqs, eps, top_k,
    BLOCK: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr,
):
    """One token: its embedding row and that row's rms_norm, its RoPE cos and sin, its sequence (how
    many sequences end at or before it) and its valid pick count."""
    launch_dependents(PDL)  # the next kernel may be a GEMV (`pdl`)
    t = tl.program_id(0).to(tl.int64)
    tok = tl.load(ids_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK)
    ok = d < dim
    x = tl.load(emb_ptr + tok * stride_e + d, mask=ok, other=0.0)
    tl.store(x_ptr + t * dim + d, x, mask=ok)
    tl.store(h_ptr + t * dim + d, rms_normed(x, w_ptr, d, ok, dim, eps).to(h_ptr.dtype.element_ty), mask=ok)
    pos = tl.load(pos_ptr + t)
    i = tl.arange(0, BLOCK_HALF)
    i_ok = i < half
    angles = pos.to(tl.float32) * tl.load(inv_ptr + i, mask=i_ok, other=0.0)
    tl.store(cos_ptr + t * half + i, tl.cos(angles), mask=i_ok)
    tl.store(sin_ptr + t * half + i, tl.sin(angles), mask=i_ok)
    seq = tl.zeros([], tl.int64)
    for s0 in range(0, num_seqs, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        ends = tl.load(cu_ptr + 1 + s, mask=s < num_seqs, other=0)
        seq += tl.sum(((ends <= t) & (s < num_seqs)).to(tl.int64), axis=0)
    tl.store(seq_ptr + t, seq)
    tl.store(valid_ptr + t, tl.minimum(pos + 1, top_k).to(tl.int32))


def step_inputs(input_ids, positions, cu_query_lens, embedding, norm_weight, eps: float, inv_freq, top_k: int):
    """Same contract as `reference.step_inputs`, in one kernel (a program a token)."""
    from rooftop.engine.kernels.reference import StepInputs

    num_tokens, dim, half = input_ids.shape[0], embedding.shape[1], inv_freq.shape[0]
    dev = embedding.device
    x = torch.empty(num_tokens, dim, dtype=embedding.dtype, device=dev)
    h = torch.empty_like(x)
    cos = torch.empty(num_tokens, half, dtype=torch.float32, device=dev)
    sin = torch.empty_like(cos)
    token_seq = torch.empty(num_tokens, dtype=torch.long, device=dev)
    valid = torch.empty(num_tokens, dtype=torch.int32, device=dev)
    if num_tokens:
        if embedding.stride(1) != 1:
            raise ValueError("step_inputs needs embedding rows with a unit stride")
        _step_inputs_kernel[(num_tokens,)](
            input_ids, positions, cu_query_lens, embedding, norm_weight, inv_freq.contiguous(), x, h, cos, sin,
            token_seq, valid, embedding.stride(0), dim, half, cu_query_lens.shape[0] - 1, eps, top_k,
            BLOCK=triton.next_power_of_2(dim), BLOCK_HALF=max(2, triton.next_power_of_2(half)), BLOCK_S=_STEP_SEQS,
            num_warps=_warps(dim), PDL=pdl.on("gemv", x.device, num_tokens),  # only lets the first GEMV start early
        )
    return StepInputs(x, h, cos, sin, token_seq, valid)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, dim] with a unit last stride (a view where possible)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Same contract as `reference.rms_norm`."""
    x2 = _rows(x)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](
            x2, x2, weight, out, out, x2.stride(0), 0, out.stride(0), 0, x2.shape[1], eps,
            HAS_RESIDUAL=False, BLOCK=triton.next_power_of_2(x2.shape[1]), num_warps=_warps(x2.shape[1]),
            **pdl.args("norms", x.device, x2.shape[0]),
        )
    return out.view(x.shape)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `reference.add_rms_norm`: (rms_norm(residual + x), residual + x)."""
    x2, r2 = _rows(x), _rows(residual)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    summed = torch.empty(x2.shape, dtype=torch.result_type(x, residual), device=x.device)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](
            x2, r2, weight, out, summed, x2.stride(0), r2.stride(0), out.stride(0), summed.stride(0),
            x2.shape[1], eps, HAS_RESIDUAL=True, BLOCK=triton.next_power_of_2(x2.shape[1]),
            num_warps=_warps(x2.shape[1]), **pdl.args("norms", x.device, x2.shape[0]),
        )
    return out.view(x.shape), summed.view(x.shape)


@triton.jit
def _rope_rows(
    t, x_ptr, cos_ptr, sin_ptr, out_ptr,
    stride_xt, stride_xh, stride_ot, stride_oh, stride_ct, num_heads, half, rest,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr,
):
    """Token t's heads of x, rotated (the first 2 * half dims) and copied (the `rest` after them) to out."""
    h = tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_HALF)
    h_ok = h < num_heads
    ok = h_ok[:, None] & (i < half)[None, :]
    src = x_ptr + t * stride_xt + h[:, None] * stride_xh
    dst = out_ptr + t * stride_ot + h[:, None] * stride_oh
    x1 = tl.load(src + i[None, :], mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(src + half + i[None, :], mask=ok, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + t * stride_ct + i, mask=i < half, other=0.0)[None, :]
    s = tl.load(sin_ptr + t * stride_ct + i, mask=i < half, other=0.0)[None, :]
    dtype = out_ptr.dtype.element_ty
    tl.store(dst + i[None, :], (x1 * c - x2 * s).to(dtype), mask=ok)
    tl.store(dst + half + i[None, :], (x2 * c + x1 * s).to(dtype), mask=ok)
    if BLOCK_REST > 0:
        j = tl.arange(0, BLOCK_REST)
        ok_rest = h_ok[:, None] & (j < rest)[None, :]
        tail = tl.load(src + 2 * half + j[None, :], mask=ok_rest, other=0.0)
        tl.store(dst + 2 * half + j[None, :], tail, mask=ok_rest)


@triton.jit
def _rope_kernel(
    x_ptr, cos_ptr, sin_ptr, out_ptr,
    stride_xt, stride_xh, stride_ot, stride_oh, stride_ct, num_heads, half, rest,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr,
):
    _rope_rows(tl.program_id(0).to(tl.int64), x_ptr, cos_ptr, sin_ptr, out_ptr, stride_xt, stride_xh, stride_ot,
               stride_oh, stride_ct, num_heads, half, rest, BLOCK_H, BLOCK_HALF, BLOCK_REST)


@triton.jit
def _rope2_kernel(
    x_ptr, out_ptr, stride_xt, stride_xh, stride_ot, stride_oh, num_heads, rest,
    y_ptr, yout_ptr, stride_yt, stride_yh, stride_yot, stride_yoh, y_heads, y_rest,
    cos_ptr, sin_ptr, stride_ct, half,
    BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_REST: tl.constexpr,
    Y_BLOCK_H: tl.constexpr, Y_BLOCK_REST: tl.constexpr,
):
    """Two tensors' RoPE in one launch: programs (token, 0) take x, (token, 1) take y."""
    t = tl.program_id(0).to(tl.int64)
    if tl.program_id(1) == 0:
        _rope_rows(t, x_ptr, cos_ptr, sin_ptr, out_ptr, stride_xt, stride_xh, stride_ot, stride_oh, stride_ct,
                   num_heads, half, rest, BLOCK_H, BLOCK_HALF, BLOCK_REST)
    else:
        _rope_rows(t, y_ptr, cos_ptr, sin_ptr, yout_ptr, stride_yt, stride_yh, stride_yot, stride_yoh, stride_ct,
                   y_heads, half, y_rest, Y_BLOCK_H, BLOCK_HALF, Y_BLOCK_REST)


def _rope_operand(x: torch.Tensor, half: int) -> tuple:
    """x as [T, H, D] with a unit last stride, its output, and the kernel's per-operand arguments."""
    x3 = x if x.dim() == 3 else x[:, None, :]
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    tokens, heads, dim = x3.shape
    rest = dim - 2 * half
    out = torch.empty(tokens, heads, dim, dtype=x.dtype, device=x.device)
    args = (x3, out, x3.stride(0), x3.stride(1), out.stride(0), out.stride(1), heads, rest)
    blocks = (triton.next_power_of_2(heads), triton.next_power_of_2(rest) if rest else 0)
    return out, args, blocks


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Same contract as `reference.rope`: x [T, D] or [T, H, D] (any token/head strides)."""
    half = cos.shape[-1]
    out, (x3, _, sxt, sxh, sot, soh, heads, rest), (block_h, block_rest) = _rope_operand(x, half)
    cos, sin = cos.contiguous(), sin.contiguous()
    if out.shape[0]:
        _rope_kernel[(out.shape[0],)](
            x3, cos, sin, out, sxt, sxh, sot, soh, cos.stride(0), heads, half, rest,
            BLOCK_H=block_h, BLOCK_HALF=triton.next_power_of_2(half), BLOCK_REST=block_rest, num_warps=4,
        )
    return out.view(x.shape)


def rope2(x: torch.Tensor, y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `reference.rope2`: (rope(x), rope(y)) for the same tokens, in one launch."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"rope2: {x.shape[0]} and {y.shape[0]} tokens")
    half = cos.shape[-1]
    x_out, x_args, (x_bh, x_br) = _rope_operand(x, half)
    y_out, y_args, (y_bh, y_br) = _rope_operand(y, half)
    cos, sin = cos.contiguous(), sin.contiguous()
    if x_out.shape[0]:
        _rope2_kernel[(x_out.shape[0], 2)](
            *x_args, *y_args, cos, sin, cos.stride(0), half,
            BLOCK_HALF=triton.next_power_of_2(half), BLOCK_H=x_bh, BLOCK_REST=x_br, Y_BLOCK_H=y_bh, Y_BLOCK_REST=y_br,
            num_warps=4,
        )
    return x_out.view(x.shape), y_out.view(y.shape)


@triton.jit
def _absorb_rope2_kernel(
    q_ptr, w_ptr, a_ptr, stride_qh, stride_wh, stride_wk, stride_ah, nope, cols, strips,
    x_ptr, out_ptr, stride_xt, stride_xh, stride_ot, stride_oh, num_heads, rest,
    y_ptr, yout_ptr, stride_yt, stride_yh, stride_yot, stride_yoh, y_heads, y_rest,
    cos_ptr, sin_ptr, stride_ct, half,
    BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_REST: tl.constexpr,
    Y_BLOCK_H: tl.constexpr, Y_BLOCK_REST: tl.constexpr, PDL: tl.constexpr,
):
    """One token's absorbed query and both RoPEs in one launch, side by side: programs (head, strip)
    take a[head, strip] = q[head, :nope] @ w[head, :nope, strip] (a register GEMV over an
    N-contiguous weight, fp32 sums); the last two programs rotate x and y as `_rope2_kernel` does.
    A product program loads its strip of w before waiting for the kernel that writes q (`pdl`)."""
    launch_dependents(PDL)
    pid = tl.program_id(0)
    products = tl.num_programs(0) - 2
    if pid < products:
        head = (pid // strips).to(tl.int64)
        n = (pid % strips) * BLOCK_N + tl.arange(0, BLOCK_N)
        k = tl.arange(0, BLOCK_K)
        n_ok = n < cols
        k_ok = k < nope
        w = tl.load(w_ptr + head * stride_wh + k[:, None] * stride_wk + n[None, :],
                    mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        wait_prior(PDL)
        q = tl.load(q_ptr + head * stride_qh + k, mask=k_ok, other=0.0).to(tl.float32)
        a = tl.sum(w.to(tl.float32) * q[:, None], axis=0)
        tl.store(a_ptr + head * stride_ah + n, a.to(a_ptr.dtype.element_ty), mask=n_ok)
    else:
        wait_prior(PDL)
        if pid == products:
            _rope_rows(0, x_ptr, cos_ptr, sin_ptr, out_ptr, stride_xt, stride_xh, stride_ot, stride_oh, stride_ct,
                       num_heads, half, rest, BLOCK_H, BLOCK_HALF, BLOCK_REST)
        else:
            _rope_rows(0, y_ptr, cos_ptr, sin_ptr, yout_ptr, stride_yt, stride_yh, stride_yot, stride_yoh, stride_ct,
                       y_heads, half, y_rest, Y_BLOCK_H, BLOCK_HALF, Y_BLOCK_REST)


# A product program's share of W_UK, in bytes (as triton_matmul.GEMV_PROGRAM_BYTES).
ABSORB_PROGRAM_BYTES = 8 << 10


def absorb_rope2(q_nope: torch.Tensor, w_uk: torch.Tensor, x: torch.Tensor, y: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as `reference.absorb_rope2` for one token: (q_nope [1, H, nope] @ w_uk [H, nope, C]
    per head -> [1, H, C], rope(x), rope(y)) in one launch, the products beside the rotations (each
    would be a launch of its own: on a C=1 step the rotation then waits behind the product)."""
    tokens, heads, nope = q_nope.shape
    if tokens != 1 or x.shape[0] != 1 or y.shape[0] != 1:
        raise ValueError(f"absorb_rope2 takes one token, got {tokens}, {x.shape[0]} and {y.shape[0]}")
    if w_uk.shape[:2] != (heads, nope) or w_uk.stride(-1) != 1 or q_nope.stride(-1) != 1:
        raise ValueError("absorb_rope2: w_uk must be [heads, nope, C] with C contiguous, q_nope's last dim contiguous")
    cols = w_uk.shape[2]
    half = cos.shape[-1]
    x_out, x_args, (x_bh, x_br) = _rope_operand(x, half)
    y_out, y_args, (y_bh, y_br) = _rope_operand(y, half)
    cos, sin = cos.contiguous(), sin.contiguous()
    absorbed = torch.empty(1, heads, cols, dtype=q_nope.dtype, device=q_nope.device)
    block_k = triton.next_power_of_2(nope)
    block_n = max(16, min(triton.next_power_of_2(cols), ABSORB_PROGRAM_BYTES // (block_k * w_uk.element_size())))
    strips = triton.cdiv(cols, block_n)
    _absorb_rope2_kernel[(heads * strips + 2,)](
        q_nope, w_uk, absorbed, q_nope.stride(1), w_uk.stride(0), w_uk.stride(1), absorbed.stride(1), nope, cols,
        strips, *x_args, *y_args, cos, sin, cos.stride(0), half,
        BLOCK_K=block_k, BLOCK_N=block_n, BLOCK_HALF=triton.next_power_of_2(half), BLOCK_H=x_bh, BLOCK_REST=x_br,
        Y_BLOCK_H=y_bh, Y_BLOCK_REST=y_br, num_warps=4, **pdl.args("absorb", q_nope.device),
    )
    return absorbed, x_out.view(x.shape), y_out.view(y.shape)


@triton.jit
def _norm_rope_store_row(
    t, rows_ptr, w_ptr, cos_ptr, sin_ptr, cache_ptr, slot_ptr,
    stride_r, stride_ct, width, norm_dim, rope_start, half, eps,
    BLOCK_W: tl.constexpr, BLOCK_HALF: tl.constexpr, HAS_ROPE: tl.constexpr,
):
    src = rows_ptr + t * stride_r
    row_dtype = rows_ptr.dtype.element_ty
    d = tl.arange(0, BLOCK_W)
    x = tl.load(src + d, mask=d < width, other=0.0).to(tl.float32)
    in_norm = d < norm_dim
    inv = tl.rsqrt(tl.sum(tl.where(in_norm, x * x, 0.0), axis=0) / norm_dim + eps)
    w = tl.load(w_ptr + d, mask=in_norm, other=0.0).to(tl.float32)
    # The normed part is rounded to the row dtype before RoPE and the store, as the reference's is.
    y = tl.where(in_norm, (x * inv * w).to(row_dtype).to(tl.float32), x)
    dst = cache_ptr + tl.load(slot_ptr + t).to(tl.int64) * width
    cache_dtype = cache_ptr.dtype.element_ty
    if HAS_ROPE:
        outside = (d < rope_start) | (d >= rope_start + 2 * half)
        tl.store(dst + d, y.to(cache_dtype), mask=(d < width) & outside)
        i = tl.arange(0, BLOCK_HALF)
        ok = i < half
        p1 = rope_start + i
        p2 = p1 + half
        x1 = tl.load(src + p1, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(src + p2, mask=ok, other=0.0).to(tl.float32)
        w1 = tl.load(w_ptr + p1, mask=ok & (p1 < norm_dim), other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + p2, mask=ok & (p2 < norm_dim), other=0.0).to(tl.float32)
        x1 = tl.where(p1 < norm_dim, (x1 * inv * w1).to(row_dtype).to(tl.float32), x1)
        x2 = tl.where(p2 < norm_dim, (x2 * inv * w2).to(row_dtype).to(tl.float32), x2)
        c = tl.load(cos_ptr + t * stride_ct + i, mask=ok, other=0.0)
        s = tl.load(sin_ptr + t * stride_ct + i, mask=ok, other=0.0)
        tl.store(dst + p1, (x1 * c - x2 * s).to(row_dtype).to(cache_dtype), mask=ok)
        tl.store(dst + p2, (x2 * c + x1 * s).to(row_dtype).to(cache_dtype), mask=ok)
    else:
        tl.store(dst + d, y.to(cache_dtype), mask=d < width)


@triton.jit
def _norm_rope_store_kernel(
    rows_ptr, w_ptr, cos_ptr, sin_ptr, cache_ptr, slot_ptr,
    stride_r, stride_ct, width, norm_dim, rope_start, half, eps,
    BLOCK_W: tl.constexpr, BLOCK_HALF: tl.constexpr, HAS_ROPE: tl.constexpr,
):
    _norm_rope_store_row(tl.program_id(0).to(tl.int64), rows_ptr, w_ptr, cos_ptr, sin_ptr, cache_ptr, slot_ptr,
                         stride_r, stride_ct, width, norm_dim, rope_start, half, eps, BLOCK_W, BLOCK_HALF, HAS_ROPE)


@triton.jit
def _norm_rope_store2_kernel(
    rows_ptr, w_ptr, cache_ptr, stride_r, width, norm_dim, rope_start, eps,
    b_rows_ptr, b_w_ptr, b_cache_ptr, b_stride_r, b_width, b_norm_dim, b_rope_start, b_eps,
    cos_ptr, sin_ptr, slot_ptr, stride_ct, half,
    n_ptr, n_w_ptr, n_out_ptr, n_stride, n_stride_o, n_dim, n_eps,
    BLOCK_HALF: tl.constexpr, HAS_ROPE: tl.constexpr, BLOCK_W: tl.constexpr, B_BLOCK_W: tl.constexpr,
    N_BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    """Two cached rows of each token in one launch: programs (token, 0) write the first, (token, 1) the
    second; where a third program a token is launched, (token, 2) norms the token's row of n."""
    launch_dependents_and_wait(PDL)  # the next kernel may be a GEMV (`pdl`)
    t = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    if part == 0:
        _norm_rope_store_row(t, rows_ptr, w_ptr, cos_ptr, sin_ptr, cache_ptr, slot_ptr, stride_r, stride_ct, width,
                             norm_dim, rope_start, half, eps, BLOCK_W, BLOCK_HALF, HAS_ROPE)
    elif part == 1:
        _norm_rope_store_row(t, b_rows_ptr, b_w_ptr, cos_ptr, sin_ptr, b_cache_ptr, slot_ptr, b_stride_r, stride_ct,
                             b_width, b_norm_dim, b_rope_start, half, b_eps, B_BLOCK_W, BLOCK_HALF, HAS_ROPE)
    else:
        _rms_norm_row(t, n_ptr, n_ptr, n_w_ptr, n_out_ptr, n_out_ptr, n_stride, 0, n_stride_o, 0, n_dim, n_eps,
                      False, N_BLOCK)


def norm_rope_store(
    rows: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    norm_dim: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rope_start: int,
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Same contract as `reference.norm_rope_store`."""
    rows = _rows(rows)
    tokens, width = rows.shape
    half = cos.shape[-1]
    flat = cache.view(-1, width)
    cos, sin = cos.contiguous(), sin.contiguous()
    if tokens:
        _norm_rope_store_kernel[(tokens,)](
            rows, weight, cos, sin, flat, slot_mapping.contiguous(),
            rows.stride(0), cos.stride(0), width, norm_dim, rope_start, half, eps,
            BLOCK_W=triton.next_power_of_2(width), BLOCK_HALF=triton.next_power_of_2(max(half, 1)),
            HAS_ROPE=half > 0, num_warps=_warps(width),
        )


def norm_rope_store2(first, second, cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor,
                     norm=None) -> torch.Tensor | None:
    """Same contract as `reference.norm_rope_store2`: two `reference.CachedRows` of the same tokens and
    the rms_norm of `norm` (`reference.NormRows`) where given, in one launch."""
    a_rows, b_rows = _rows(first.rows), _rows(second.rows)
    tokens = a_rows.shape[0]
    n_rows = _rows(norm.x) if norm is not None else a_rows
    if b_rows.shape[0] != tokens or n_rows.shape[0] != tokens:
        raise ValueError(f"norm_rope_store2: {tokens}, {b_rows.shape[0]} and {n_rows.shape[0]} tokens")
    normed = torch.empty(n_rows.shape, dtype=n_rows.dtype, device=n_rows.device) if norm is not None else None
    half = cos.shape[-1]
    cos, sin = cos.contiguous(), sin.contiguous()
    a_width, b_width, n_dim = a_rows.shape[1], b_rows.shape[1], n_rows.shape[1]
    if tokens:
        out = normed if norm is not None else n_rows
        _norm_rope_store2_kernel[(tokens, 2 if norm is None else 3)](
            a_rows, first.weight, first.cache.view(-1, a_width), a_rows.stride(0), a_width, first.norm_dim,
            first.rope_start, first.eps,
            b_rows, second.weight, second.cache.view(-1, b_width), b_rows.stride(0), b_width, second.norm_dim,
            second.rope_start, second.eps,
            cos, sin, slot_mapping.contiguous(), cos.stride(0), half,
            n_rows, first.weight if norm is None else norm.weight, out, n_rows.stride(0), out.stride(0), n_dim,
            first.eps if norm is None else norm.eps,
            BLOCK_HALF=triton.next_power_of_2(max(half, 1)), HAS_ROPE=half > 0,
            BLOCK_W=triton.next_power_of_2(a_width), B_BLOCK_W=triton.next_power_of_2(b_width),
            N_BLOCK=triton.next_power_of_2(n_dim),
            num_warps=_warps(max(a_width, b_width, n_dim if norm is not None else 0)),
            **pdl.args("norms", a_rows.device, tokens),
        )
    return None if normed is None else normed.view(norm.x.shape)


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, out_ptr, stride_g, stride_u, dim, BLOCK: tl.constexpr, PDL: tl.constexpr):
    launch_dependents_and_wait(PDL)  # the next kernel may be a GEMV (`pdl`)
    row = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = d < dim
    g = tl.load(g_ptr + row * stride_g + d, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + d, mask=ok, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    # torch rounds silu(g) to the dtype before the product: so does this.
    act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * dim + d, (act * u).to(dtype), mask=ok)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Same contract as `reference.silu_mul`: gate, up [T, D] (any row strides) -> [T, D]."""
    g2, u2 = _rows(gate), _rows(up)
    rows, dim = g2.shape
    out = torch.empty(rows, dim, dtype=gate.dtype, device=gate.device)
    if rows:
        block = min(1024, triton.next_power_of_2(dim))
        _silu_mul_kernel[(rows, triton.cdiv(dim, block))](
            g2, u2, out, g2.stride(0), u2.stride(0), dim, BLOCK=block, num_warps=4,
            **pdl.args("norms", gate.device, rows),
        )
    return out.view(gate.shape)


def _warps(dim: int) -> int:
    return 8 if dim >= 2048 else 4 if dim >= 512 else 2
