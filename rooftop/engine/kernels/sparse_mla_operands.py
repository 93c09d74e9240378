"""What both sparse MLA kernels (Triton's and Gluon's) take: their operands laid out as they read them."""

import torch

LOG2E = 1.4426950408889634  # the kernels' softmax runs in base 2: scale * LOG2E


def operands(q: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor, kv_lora_rank: int,
             q_rope: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, q_rope, the cache as rows [N * S, C], slots) as the sparse MLA kernels read them: unit last
    strides (q_rope defaults to q's columns past the rank), contiguous slots."""
    if q.stride(-1) != 1:
        q = q.contiguous()
    if q_rope is None:
        q_rope = q[..., kv_lora_rank:]
    elif q_rope.stride(-1) != 1:
        q_rope = q_rope.contiguous()
    width = kv_cache.shape[-1]
    kv = kv_cache.view(-1, width)
    if kv.stride(0) != width:
        raise ValueError("sparse_mla needs a contiguous kv_cache")
    return q, q_rope, kv, slots.contiguous()
