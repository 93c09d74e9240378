"""A plain reference forward in float64: whole sequence, no cache, decompressed attention.

Each position's indexer scores all positions up to itself, takes the top-k, and attention runs
over exactly those. It reads the model's weights but none of its forward code, so it checks the
paged, absorbed, chunked path independently.
"""

import torch
import torch.nn.functional as F

from rooftop.engine.model.config import ModelConfig
from rooftop.engine.model.layers import text_logits
from rooftop.engine.model.model import DSAModel


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Half-split RoPE of x [L, dim] or [L, heads, dim] at positions [L], in x's dtype."""
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=x.dtype) / dim)
    angles = positions.to(x.dtype)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    if x.dim() == 3:
        cos, sin = cos[:, None, :], sin[:, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _swiglu(x: torch.Tensor, w: dict, prefix: str) -> torch.Tensor:
    gate, up = x @ w[prefix + "gate_proj.weight"].T, x @ w[prefix + "up_proj.weight"].T
    return (F.silu(gate) * up) @ w[prefix + "down_proj.weight"].T


def reference_topk_mask(
    h: torch.Tensor, q_latent: torch.Tensor, w: dict, prefix: str, c: ModelConfig, positions: torch.Tensor
) -> torch.Tensor:
    """Bool [L, L]: True where query t selects key s (top-min(index_topk, t+1) of s <= t)."""
    n = h.shape[0]
    r = c.qk_rope_head_dim
    q = (q_latent @ w[prefix + "wq_b.weight"].T).view(n, c.index_n_heads, c.index_head_dim)
    q = torch.cat([_rope(q[..., :r], positions, c.rope_theta), q[..., r:]], dim=-1)
    k = _rms(h @ w[prefix + "wk.weight"].T, w[prefix + "k_norm.weight"], c.rms_norm_eps)
    k = torch.cat([_rope(k[:, :r], positions, c.rope_theta), k[:, r:]], dim=-1)
    weights = (h @ w[prefix + "weights_proj.weight"].T) * (c.index_n_heads * c.index_head_dim) ** -0.5
    scores = (torch.einsum("thd,sd->ths", q, k).relu() * weights[:, :, None]).sum(1)  # [L, L]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    values, idx = scores.topk(min(c.index_topk, n), dim=-1)
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask.scatter_(1, idx, values > float("-inf"))
    return mask


def _attention(h: torch.Tensor, w: dict, prefix: str, c: ModelConfig, positions: torch.Tensor) -> torch.Tensor:
    n, heads = h.shape[0], c.num_attention_heads
    q_latent = _rms(h @ w[prefix + "q_a_proj.weight"].T, w[prefix + "q_a_norm.weight"], c.rms_norm_eps)
    q = (q_latent @ w[prefix + "q_b_proj.weight"].T).view(n, heads, c.qk_head_dim)
    q_nope, q_rope = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
    q = torch.cat([q_nope, _rope(q_rope, positions, c.rope_theta)], dim=-1)
    kv = h @ w[prefix + "kv_a_proj_with_mqa.weight"].T
    latent = _rms(kv[:, : c.kv_lora_rank], w[prefix + "kv_a_norm.weight"], c.rms_norm_eps)
    k_rope = _rope(kv[:, c.kv_lora_rank :], positions, c.rope_theta)  # [L, rope], shared by heads
    kv_up = (latent @ w[prefix + "kv_b_proj.weight"].T).view(n, heads, c.qk_nope_head_dim + c.v_head_dim)
    k_nope, v = kv_up.split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)
    k = torch.cat([k_nope, k_rope[:, None, :].expand(n, heads, c.qk_rope_head_dim)], dim=-1)
    selected = reference_topk_mask(h, q_latent, w, prefix + "indexer.", c, positions)
    scores = torch.einsum("thd,shd->hts", q, k) * c.qk_head_dim**-0.5
    probs = scores.masked_fill(~selected[None], float("-inf")).softmax(-1)
    out = torch.einsum("hts,shd->thd", probs, v).reshape(n, heads * c.v_head_dim)
    return out @ w[prefix + "o_proj.weight"].T


def _moe(h: torch.Tensor, w: dict, prefix: str, c: ModelConfig) -> torch.Tensor:
    logits = h @ w[prefix + "gate.weight"].T
    scores = logits.sigmoid() if c.scoring_func == "sigmoid" else logits.softmax(-1)
    weights, ids = scores.topk(c.num_experts_per_tok, dim=-1)
    if c.norm_topk_prob:
        weights = weights / weights.sum(-1, keepdim=True)
    weights = weights * c.routed_scaling_factor
    gate, up = torch.einsum("th,eih->tei", h, w[prefix + "experts.w13"]).chunk(2, dim=-1)
    every = torch.einsum("tei,ehi->teh", F.silu(gate) * up, w[prefix + "experts.w2"])  # all experts
    chosen = every.gather(1, ids[:, :, None].expand(-1, -1, h.shape[1]))
    return (chosen * weights[:, :, None]).sum(1) + _swiglu(h, w, prefix + "shared_expert.")


@torch.no_grad()
def reference_logits(model: DSAModel, input_ids: list[int] | torch.Tensor) -> torch.Tensor:
    """Float64 logits [L, vocab] for every position of one sequence, from position 0."""
    c = model.config
    w = {k: v.detach().to("cpu", torch.float64) for k, v in model.state_dict().items()}
    ids = torch.as_tensor(input_ids, dtype=torch.long).cpu()
    positions = torch.arange(len(ids))
    x = w["embedding.weight"][ids]
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        x = x + _attention(_rms(x, w[p + "attn_norm.weight"], c.rms_norm_eps), w, p + "attn.", c, positions)
        h = _rms(x, w[p + "ffn_norm.weight"], c.rms_norm_eps)
        x = x + (_swiglu(h, w, p + "mlp.") if i < c.first_k_dense_replace else _moe(h, w, p + "moe.", c))
    x = _rms(x, w["final_norm.weight"], c.rms_norm_eps)
    return text_logits(x @ w["lm_head.weight"].T, c.eos_token_id)


def reference_greedy(model: DSAModel, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """Greedy continuation of `prompt_ids` by the reference forward (argmax each step; EOS not special)."""
    ids = list(prompt_ids)
    for _ in range(max_tokens):
        ids.append(int(reference_logits(model, ids)[-1].argmax()))
    return ids[len(prompt_ids) :]
