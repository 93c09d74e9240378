"""Mixture of experts: a router, routed SwiGLU experts (stacked weights), and a shared expert."""

import torch
from torch import nn

from rooftop.engine.kernels import dispatch as kernels
from rooftop.engine.model.config import ModelConfig
from rooftop.engine.model.layers import RMSNorm, SharedExpert

# Up to this many tokens the shared expert runs inside the routed experts' kernels: its pairs fill one
# 16-row block, so its weights are read once. At 64 tokens its four blocks read them four times, and
# the H200's graphed C=64 step took 3.54 ms against 3.01 ms with the shared expert in cuBLAS.
SHARED_FOLD_MAX_TOKENS = 16


class Router(nn.Module):
    """Gate scores (sigmoid or softmax) -> each token's top-k experts and their weights."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.top_k, self.scoring_func = c.num_experts_per_tok, c.scoring_func
        self.norm_topk_prob, self.scaling = c.norm_topk_prob, c.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(c.n_routed_experts, c.hidden_size))

    def forward(self, x: torch.Tensor, layout_experts: int | None = None,
                shared: bool = False) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
        """x [T, hidden] -> (weights float32 [T, k], expert ids [T, k], the experts' pair layout or None;
        see `kernels.route`)."""
        return kernels.route(x, self.weight, self.top_k, self.scoring_func, self.norm_topk_prob, self.scaling,
                             layout_experts, shared)


class RoutedExperts(nn.Module):
    """E SwiGLU experts as stacked weights: w13 [E, 2I, hidden] (gate; up), w2 [E, hidden, I]."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        e, i, h = c.n_routed_experts, c.moe_intermediate_size, c.hidden_size
        self.w13 = nn.Parameter(torch.empty(e, 2 * i, h))
        self.w2 = nn.Parameter(torch.empty(e, h, i))

    def forward(self, x, ids, weights, shared=None, residual=None, shared_w13=None, shared_w2=None, next_norm=None,
                layout=None):
        """residual + (routed experts + shared), each part optional, and its norm with `next_norm`
        (see `kernels.moe_experts`)."""
        return kernels.moe_experts(x, ids, weights, self.w13, self.w2, shared=shared, residual=residual,
                                   shared_w13=shared_w13, shared_w2=shared_w2, next_norm=next_norm, layout=layout)


class MoE(nn.Module):
    """Routed experts (top-k of n_routed_experts) plus the shared expert(s)."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gate = Router(c)
        self.experts = RoutedExperts(c)
        self.shared_expert = SharedExpert(c.hidden_size, c.n_shared_experts * c.moe_intermediate_size)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                next_norm: RMSNorm | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """routed + shared experts of x, added to `residual` where given (one kernel on the Triton path);
        with `next_norm`, -> (that, next_norm(that)), the norm in the same last kernel.

        On the Triton path a shared expert as wide as a routed one runs inside the routed experts'
        kernels, as one more expert every token picks (three launches fewer a layer); a trace then
        attributes its time to `experts`, not `shared_expert`."""
        shared = self.shared_expert
        num_experts = self.experts.w13.shape[0]
        fold = (x.shape[0] <= SHARED_FOLD_MAX_TOKENS and shared.down_proj.weight.shape == self.experts.w2.shape[1:]
                and kernels.folds_shared_expert(x, self.gate.top_k, num_experts))
        # The router's kernel lays out the pairs for the experts' kernels (the shared expert one more).
        weights, ids, layout = self.gate(x, layout_experts=num_experts + fold, shared=fold)
        norm = None if next_norm is None else (next_norm.weight, next_norm.eps)
        if fold:
            return self.experts(x, ids, weights, residual=residual, shared_w13=shared.w13(),
                                shared_w2=shared.down_proj.weight, next_norm=norm, layout=layout)
        return self.experts(x, ids, weights, shared=shared(x), residual=residual, next_norm=norm, layout=layout)
