"""Rotary position embedding (half-split form): the angles from absolute positions.

The rotation itself is a kernel: `kernels.rope` / `kernels.norm_rope_store`."""

import torch


def rope_cos_sin(positions: torch.Tensor, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, float32 [T, dim/2], for rotating `dim`-wide vectors at `positions` [T]."""
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()
