"""Ask L2 for the next kernel's weights while this one runs (sm_90 bulk prefetch, fire and forget).

A decode step at batch 1 is a chain of small weight reads, each its own kernel: each pays a DRAM
round trip and a ramp before its bytes stream. A kernel given the next one's weight spreads
`cp.async.bulk.prefetch.L2` requests for it over its programs and threads; the requests take no
registers, no shared memory and no wait, and the next kernel then finds its weight in L2 (50 MB on
an H100/H200). Where it pays and where not: docs/perf/engine-serve-h200.md.
"""

import torch
import triton
import triton.language as tl

# Lanes (threads) a program spreads its share over: one bulk request each.
LANES = 128


@triton.jit
def prefetch_share(base, program, num_programs, total_bytes, LANES: tl.constexpr):
    """Bulk-prefetch program `program`'s share (of `num_programs`) of the bytes [base, base + total_bytes)
    into L2. `base` is 16-byte aligned and total_bytes a multiple of 16 (see `region`)."""
    per_program = tl.cdiv(tl.cdiv(total_bytes, num_programs), 16 * LANES) * (16 * LANES)
    per_lane = per_program // LANES
    lane = tl.arange(0, LANES).to(tl.int64)
    start = program.to(tl.int64) * per_program + lane * per_lane
    size = tl.minimum(tl.maximum(total_bytes - start, 0), per_lane).to(tl.int32)
    ptrs = base.to(tl.pointer_type(tl.int8)) + start
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [ptrs, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_grid_share(base, total_bytes, LANES: tl.constexpr):
    """`prefetch_share` with this program's place in its (up to 3-D) grid."""
    n0 = tl.num_programs(0)
    n1 = tl.num_programs(1)
    program = tl.program_id(0) + n0 * (tl.program_id(1) + n1 * tl.program_id(2))
    prefetch_share(base, program, n0 * n1 * tl.num_programs(2), total_bytes, LANES)


def region(t: torch.Tensor | None) -> tuple[torch.Tensor, int] | None:
    """(t, its bytes) where t can be prefetched whole (a CUDA tensor over one contiguous, 16-byte
    aligned span of a multiple of 16 bytes, on an sm_90+ device), else None."""
    if t is None or not t.is_cuda or t.numel() == 0:
        return None
    nbytes = t.numel() * t.element_size()
    if not _dense(t):
        return None
    if t.data_ptr() % 16 or nbytes % 16 or nbytes >= 1 << 31:
        return None
    if torch.cuda.get_device_capability(t.device)[0] < 9:
        return None
    return t, nbytes


def _dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill one span with no gaps, in some order of its dims (a transpose of a
    contiguous tensor, say), starting at data_ptr."""
    expect = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1):
        if stride != expect:
            return False
        expect *= size
    return True
