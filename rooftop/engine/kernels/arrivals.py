"""Arrival counters: the last program of a group to finish does the group's final merge, in-kernel.

A kernel whose programs split a reduction (K of a GEMM, the top-k range of sparse MLA) used to
write fp32 partials and launch a second kernel to merge them. Instead every program of a group
counts its arrival on a per-group counter once its partial is stored; the one that arrives last
merges all partials (in split order, so results stay deterministic whichever program is last) and
re-arms the counter to 0 for the next launch. One launch a merge fewer.

The counters are one int32 buffer per device, zeroed once and kept: a captured CUDA graph holds its
address, so a buffer is never freed (a larger one is made beside it outside a capture). Kernels that
use them must not run concurrently on one device (the engine runs its steps on one stream).
"""

import torch
import triton
import triton.language as tl

_MIN_COUNTERS = 1 << 16  # 256 KB: every token of a large prefill chunk (the router counts one a token)
_buffers: dict[torch.device, list[torch.Tensor]] = {}


def counters(device: torch.device, n: int) -> torch.Tensor:
    """An int32 buffer of at least `n` zeroed counters on `device` (re-armed by the kernels after use)."""
    device = torch.device(device)
    kept = _buffers.setdefault(device, [])
    if kept and kept[-1].numel() >= n:
        return kept[-1]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"arrival counters: {n} needed while capturing a CUDA graph, {kept[-1].numel() if kept else 0} made; "
            "run the same shapes once before capturing (the engine's warm-up does)")
    kept.append(torch.zeros(max(n, _MIN_COUNTERS), dtype=torch.int32, device=device))
    return kept[-1]


@triton.jit
def arrive_last(counter_ptr, group_size):
    """Count this program's arrival at `counter_ptr`; True for the last of `group_size` programs, which
    then sees every other program's stores (acquire-release at GPU scope). The barrier first makes all
    of this program's threads' stores precede the count. The last program re-arms the counter with
    `rearm` once it has read what it needs."""
    tl.debug_barrier()
    return tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == group_size - 1


@triton.jit
def rearm(counter_ptr):
    """Reset a counter for the next launch (called by the last program only)."""
    tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
