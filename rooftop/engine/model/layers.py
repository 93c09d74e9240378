"""Small building blocks: RMSNorm, the SwiGLU MLPs (dense layers and the shared expert), the text mask."""

import functools

import torch
from torch import nn

from rooftop.engine.kernels import dispatch as kernels
from rooftop.engine.kernels import pdl


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, self.weight, self.eps)


class Linear(nn.Linear):
    """A bias-free nn.Linear whose product goes through the kernels (`kernels.linear`: Triton for
    decode-sized inputs on the GPU, F.linear otherwise); same parameters and state-dict keys."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.linear(x, self.weight)


def project(owner: nn.Module, x: torch.Tensor, linears: list[nn.Linear]) -> list[torch.Tensor]:
    """x through several bias-free Linears that read it: where the kernels run in Triton, one GEMM over
    their weights stacked once (cached on `owner`, rebuilt when a weight is replaced or changed in
    place); else each Linear on its own, as the reference always does."""
    if not kernels.use_triton(x):
        return [linear(x) for linear in linears]
    return list(kernels.linear(x, stacked_weight(owner, linears)).split([lin.out_features for lin in linears], dim=-1))


def stacked_weight(owner: nn.Module, linears: list[nn.Linear]) -> torch.Tensor:
    """The Linears' weights stacked along the output dim, cached on `owner` (outside its state dict;
    one entry per set of Linears) and rebuilt when a weight is replaced or changed in place."""
    key = tuple((lin.weight.data_ptr(), lin.weight._version, lin.weight.dtype) for lin in linears)
    cache = owner.__dict__.setdefault("_stacked_weights", {})
    cached = cache.get(tuple(map(id, linears)))
    if cached is None or cached[0] != key:
        stacked = torch.cat([lin.weight.detach() for lin in linears])
        if pdl.supported(stacked.device):
            # The GEMV that reads it next may be launched with PDL (kernels/pdl.py): it loads its weights
            # before waiting for the kernel before it, whose stores it is not promised to see yet.
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("stacked projection weights built while capturing a CUDA graph: run the "
                                   "step once before capturing (the engine's warm-up does)")
            torch.cuda.current_stream(stacked.device).synchronize()  # once, when first used or changed
        cached = (key, stacked)
        cache[tuple(map(id, linears))] = cached
    return cached[1]


class DenseMLP(nn.Module):
    """SwiGLU MLP: down(silu(gate(x)) * up(x)); the first `first_k_dense_replace` layers use it."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = project(self, x, [self.gate_proj, self.up_proj])
        return self.down_proj(kernels.silu_mul(gate, up))


class SharedExpert(DenseMLP):
    """The MoE's always-on expert: a SwiGLU MLP, named apart so profiles attribute it."""

    def w13(self) -> torch.Tensor:
        """Gate rows then up rows [2I, hidden], as the routed experts' w13 holds them (cached)."""
        return stacked_weight(self, [self.gate_proj, self.up_proj])


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
