"""Rotary position embedding (half-split form): the angles from absolute positions.

The rotation itself is a kernel: `kernels.rope` / `kernels.norm_rope_store`."""

import functools

import torch


def inv_freq(dim: int, theta: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 [dim/2]: the angle a position turns each rotated pair by, theta^(-2i/dim)."""
    return 1.0 / theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)


@functools.cache
def cached_inv_freq(dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """`inv_freq`, made once a device and kept (a captured graph reads its address)."""
    return inv_freq(dim, theta, device)

