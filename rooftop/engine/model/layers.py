"""Small building blocks: RMSNorm, the SwiGLU MLPs (dense layers and the shared expert), the text mask."""

import functools

import torch
import torch.nn.functional as F
from torch import nn

from rooftop.engine.kernels import dispatch as kernels


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, self.weight, self.eps)


class DenseMLP(nn.Module):
    """SwiGLU MLP: down(silu(gate(x)) * up(x)); the first `first_k_dense_replace` layers use it."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SharedExpert(DenseMLP):
    """The MoE's always-on expert: a SwiGLU MLP, named apart so profiles attribute it."""


@functools.cache
def _text_mask(vocab_size: int, eos_id: int, device: torch.device) -> torch.Tensor:
    allowed = torch.zeros(vocab_size, dtype=torch.bool)
    allowed[0x20:0x7F] = True
    allowed[[0x09, 0x0A, eos_id]] = True
    return torch.where(allowed, 0.0, float("-inf")).to(device)


def text_logits(logits: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Logits with every id but printable ASCII, tab, newline and <eos> at -inf.

    The byte tokenizer maps those one byte = one token = one character, so a client counting tokens
    from the streamed text agrees with the server's usage; random weights would otherwise emit
    stray UTF-8 bytes (decoded as U+FFFD) and padding ids that decode to nothing.
    """
    return logits + _text_mask(logits.shape[-1], eos_id, logits.device).to(logits.dtype)
