"""Multi-head latent attention: q-LoRA, a compressed latent KV cached per token, absorbed sparse attention."""

import torch
from torch import nn

from rooftop.engine.kernels import dispatch as kernels
from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.batch import ForwardBatch
from rooftop.engine.model.config import ModelConfig
from rooftop.engine.model.indexer import Indexer
from rooftop.engine.model.layers import RMSNorm
from rooftop.engine.model.rope import apply_rope


def positions_to_slots(
    positions: torch.Tensor, token_seq: torch.Tensor, block_tables: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Map token positions [T, K] (-1 = none) of each token's sequence to flat cache slots (-1 kept)."""
    pos = positions.clamp(min=0)
    blocks = block_tables.long()[token_seq[:, None], pos // block_size]
    return torch.where(positions >= 0, blocks * block_size + pos % block_size, -1)


class SparseAttention(nn.Module):
    """Attention of absorbed queries over their top-k latent rows; the output stays in latent space."""

    def __init__(self, kv_lora_rank: int, scale: float):
        super().__init__()
        self.kv_lora_rank, self.scale = kv_lora_rank, scale

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """q [T, H, kv_lora_rank + rope], kv_cache [N, S, same], slots [T, K] -> [T, H, kv_lora_rank]."""
        return kernels.sparse_mla(q, kv_cache, slots, self.kv_lora_rank, self.scale)


class MLAttention(nn.Module):
    """MLA with the DSA indexer: writes this step's latent rows, picks top-k, attends in absorbed form."""

    def __init__(self, c: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads = c.num_attention_heads
        self.nope_dim, self.rope_dim, self.v_dim = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        self.kv_lora_rank = c.kv_lora_rank
        self.q_a_proj = nn.Linear(c.hidden_size, c.q_lora_rank, bias=False)
        self.q_a_norm = RMSNorm(c.q_lora_rank, c.rms_norm_eps)
        self.q_b_proj = nn.Linear(c.q_lora_rank, c.num_attention_heads * c.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(c.hidden_size, c.kv_cache_dim, bias=False)
        self.kv_a_norm = RMSNorm(c.kv_lora_rank, c.rms_norm_eps)
        self.kv_b_proj = nn.Linear(
            c.kv_lora_rank, c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim), bias=False
        )
        self.o_proj = nn.Linear(c.num_attention_heads * c.v_head_dim, c.hidden_size, bias=False)
        self.indexer = Indexer(c)
        self.sparse_attn = SparseAttention(c.kv_lora_rank, c.qk_head_dim**-0.5)

    def forward(
        self,
        x: torch.Tensor,
        batch: ForwardBatch,
        cache: KVCache,
        cos: torch.Tensor,
        sin: torch.Tensor,
        token_seq: torch.Tensor,
    ) -> torch.Tensor:
        """x [T, hidden] (normed) -> [T, hidden]; token_seq [T] = each token's sequence index."""
        num_tokens = x.shape[0]
        q_latent = self.q_a_norm(self.q_a_proj(x))
        q = self.q_b_proj(q_latent).view(num_tokens, self.n_heads, self.nope_dim + self.rope_dim)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        q_rope = apply_rope(q_rope, cos, sin)

        # The cached row: normed latent + the shared RoPE key, already rotated.
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        row = torch.cat([self.kv_a_norm(latent), apply_rope(k_rope, cos, sin)], dim=-1)
        latent_cache = cache.latent[self.layer_idx]
        latent_cache.view(-1, row.shape[-1])[batch.slot_mapping] = row

        positions = self.indexer(x, q_latent, batch, cache.index_k[self.layer_idx], cos, sin)
        slots = positions_to_slots(positions, token_seq, batch.block_tables, cache.block_size)

        # Absorb W_UK into the query and apply W_UV after attention: heads share the latent rows.
        w_kv = self.kv_b_proj.weight.view(self.n_heads, self.nope_dim + self.v_dim, self.kv_lora_rank)
        w_uk, w_uv = w_kv.split([self.nope_dim, self.v_dim], dim=1)  # [H, nope, C], [H, v, C]
        q_absorbed = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [T, H, C]
        out_latent = self.sparse_attn(torch.cat([q_absorbed, q_rope], dim=-1), latent_cache, slots)
        out = torch.bmm(out_latent.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)  # [T, H, v]
        return self.o_proj(out.reshape(num_tokens, self.n_heads * self.v_dim))
