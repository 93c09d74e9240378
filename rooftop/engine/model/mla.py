"""Multi-head latent attention: q-LoRA, a compressed latent KV cached per token, absorbed sparse attention."""

import torch
from torch import nn

from rooftop.engine.kernels import dispatch as kernels
from rooftop.engine.kernels.reference import CachedRows, NormRows
from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.batch import ForwardBatch, StepTensors
from rooftop.engine.model.config import ModelConfig
from rooftop.engine.model.indexer import Indexer
from rooftop.engine.model.layers import Linear, RMSNorm, project


class SparseAttention(nn.Module):
    """Attention of absorbed queries over their top-k latent rows; the output stays in latent space."""

    def __init__(self, kv_lora_rank: int, scale: float):
        super().__init__()
        self.kv_lora_rank, self.scale = kv_lora_rank, scale

    def forward(
        self, q: torch.Tensor, q_rope: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor,
        valid_lens: torch.Tensor,
    ) -> torch.Tensor:
        """q [T, H, kv_lora_rank] (absorbed), q_rope [T, H, rope], kv_cache [N, S, kv_lora_rank + rope],
        slots [T, K] -> [T, H, kv_lora_rank]."""
        return kernels.sparse_mla(q, kv_cache, slots, self.kv_lora_rank, self.scale, q_rope=q_rope,
                                  valid_lens=valid_lens)


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
        self.q_b_proj = Linear(c.q_lora_rank, c.num_attention_heads * c.qk_head_dim)
        self.kv_a_proj_with_mqa = nn.Linear(c.hidden_size, c.kv_cache_dim, bias=False)
        self.kv_a_norm = RMSNorm(c.kv_lora_rank, c.rms_norm_eps)
        self.kv_b_proj = nn.Linear(
            c.kv_lora_rank, c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim), bias=False
        )
        self.o_proj = Linear(c.num_attention_heads * c.v_head_dim, c.hidden_size)
        self.indexer = Indexer(c)
        self.sparse_attn = SparseAttention(c.kv_lora_rank, c.qk_head_dim**-0.5)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: KVCache, step: StepTensors) -> torch.Tensor:
        """x [T, hidden] (normed) -> [T, hidden]."""
        num_tokens = x.shape[0]
        # Four projections read x: one GEMM on the Triton path.
        q_a, kv_a, index_k, index_w = project(
            self, x, [self.q_a_proj, self.kv_a_proj_with_mqa, self.indexer.wk, self.indexer.weights_proj])
        # One kernel: the cached rows (the normed latent + the shared RoPE key, already rotated; the
        # indexer's key, normed, its first dims rotated) and the q latent's norm.
        latent_cache, index_k_cache = cache.latent[self.layer_idx], cache.index_k[self.layer_idx]
        q_latent = kernels.norm_rope_store2(
            CachedRows(kv_a, self.kv_a_norm.weight, self.kv_a_norm.eps, self.kv_lora_rank, self.kv_lora_rank,
                       latent_cache),
            self.indexer.key_rows(index_k, index_k_cache), step.cos, step.sin, batch.slot_mapping,
            norm=NormRows(q_a, self.q_a_norm.weight, self.q_a_norm.eps),
        )
        # Two more read the q latent: attention's queries and the indexer's.
        q, index_q = project(self, q_latent, [self.q_b_proj, self.indexer.wq_b])
        q = q.view(num_tokens, self.n_heads, self.nope_dim + self.rope_dim)
        # Absorb W_UK into the query and apply W_UV after attention: heads share the latent rows.
        w_kv = self.kv_b_proj.weight.view(self.n_heads, self.nope_dim + self.v_dim, self.kv_lora_rank)
        w_uk, w_uv = w_kv.split([self.nope_dim, self.v_dim], dim=1)  # [H, nope, C], [H, v, C]
        # The absorbed query [T, H, C] and both queries' RoPE (the indexer's: its first qk_rope_head_dim
        # dims): one kernel at one token, else two.
        q_absorbed, q_rope, index_q = kernels.absorb_rope2(
            q[..., : self.nope_dim], w_uk, q[..., self.nope_dim:], self.indexer.query_heads(index_q), step.cos, step.sin)

        slots = self.indexer(index_q, index_w, batch, index_k_cache, step, as_slots=True)
        out_latent = self.sparse_attn(q_absorbed, q_rope, latent_cache, slots, step.valid_lens)
        # W_UV per head, written token-major [T, H, v] so o_proj reads it as it lies (a head-major result
        # cost a copy kernel a layer past one token)
        out = out_latent.new_empty(num_tokens, self.n_heads, self.v_dim)
        kernels.bmm(out_latent.transpose(0, 1), w_uv.transpose(1, 2), out=out.transpose(0, 1))
        return self.o_proj(out.view(num_tokens, self.n_heads * self.v_dim))
