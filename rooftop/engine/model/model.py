"""DSAModel: embedding -> layers (MLA + indexer, dense MLP or MoE) -> norm -> lm_head, over a paged cache;
and its multi-token prediction modules (DeepSeek-V3's MTP), which the engine drafts with."""

import torch
from torch import nn

from rooftop.engine.kernels import dispatch as kernels
from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.batch import ForwardBatch, StepTensors
from rooftop.engine.model.config import ModelConfig
from rooftop.engine.model.layers import DenseMLP, Linear, RMSNorm, text_logits
from rooftop.engine.model.mla import MLAttention
from rooftop.engine.model.moe import MoE
from rooftop.engine.model.rope import cached_inv_freq


class DecoderLayer(nn.Module):
    """Pre-norm residual block: attention, then a dense MLP (first layers) or an MoE."""

    def __init__(self, c: ModelConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.attn = MLAttention(c, layer_idx)
        self.ffn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.is_dense = layer_idx < c.first_k_dense_replace
        if self.is_dense:
            self.mlp = DenseMLP(c.hidden_size, c.intermediate_size)
        else:
            self.moe = MoE(c)

    def forward(self, x: torch.Tensor, h: torch.Tensor, batch: ForwardBatch, cache: KVCache, step: StepTensors,
                next_norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual stream x, h = attn_norm(x)) -> (x after this layer, next_norm of it): each layer
        hands the next its normed input, so the norm rides in this layer's last kernel."""
        attn = self.attn(h, batch, cache, step)
        h, x = kernels.add_rms_norm(attn, x, self.ffn_norm.weight, self.ffn_norm.eps)  # x += attn; h = norm(x)
        if self.is_dense:
            h, x = kernels.add_rms_norm(self.mlp(h), x, next_norm.weight, next_norm.eps)  # x += mlp; h = norm(x)
            return x, h
        return self.moe(h, residual=x, next_norm=next_norm)


class MTPLayer(nn.Module):
    """One MTP module: h' = eh_proj(concat(enorm(emb(t_{i+1})), hnorm(h_i))), then a decoder layer of its own
    (cache layer `layer_idx`, past the model's layers); DSAModel.mtp_forward runs it."""

    def __init__(self, c: ModelConfig, layer_idx: int):
        super().__init__()
        self.enorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hnorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.eh_proj = Linear(2 * c.hidden_size, c.hidden_size)
        self.block = DecoderLayer(c, layer_idx)


class DSAModel(nn.Module):
    """The whole model; `model(batch, cache)` -> float32 logits [B, vocab] of each sequence's last new token
    (or of `batch.logit_rows`, and with the final-normed hidden states [T, hidden] when `batch.return_hidden`)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = Linear(config.hidden_size, config.vocab_size)
        # registered last, so a seed draws the main model's weights as it did before MTP existed
        self.mtp = nn.ModuleList(MTPLayer(config, config.num_hidden_layers + i)
                                 for i in range(config.num_nextn_predict_layers))
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding with lm_head when the config says so (again after to_empty/to)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embedding.weight

    @property
    def device(self) -> torch.device:
        return self.embedding.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding.weight.dtype

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: KVCache) -> torch.Tensor:
        c = self.config
        first_norm = self.layers[0].attn_norm
        weight = self.embedding.weight
        # The embedding rows, the first norm and the per-token step tensors: one kernel on the Triton path.
        x, h, cos, sin, token_seq, valid_lens = kernels.step_inputs(
            batch.input_ids, batch.positions, batch.cu_query_lens, weight, first_norm.weight, first_norm.eps,
            cached_inv_freq(c.qk_rope_head_dim, c.rope_theta, weight.device), c.index_topk)
        step = StepTensors(cos, sin, token_seq, valid_lens)
        next_norms = [layer.attn_norm for layer in self.layers[1:]] + [self.final_norm]
        for layer, next_norm in zip(self.layers, next_norms, strict=True):
            x, h = layer(x, h, batch, cache, step, next_norm)
        return self._head(h, batch)

    def _head(self, h: torch.Tensor, batch: ForwardBatch):
        """Logits of each sequence's last new token, or of batch.logit_rows; with h when batch.return_hidden."""
        rows = batch.cu_query_lens[1:].long() - 1 if batch.logit_rows is None else batch.logit_rows
        logits = text_logits(self.lm_head(h[rows]).float(), self.config.eos_token_id)
        return (logits, h) if batch.return_hidden else logits

    @torch.inference_mode()
    def mtp_forward(self, batch: ForwardBatch, cache: KVCache, hidden: torch.Tensor, depth: int = 0):
        """MTP module `depth` over batch, whose input_ids are the tokens after its positions (t_{i+1} at
        position i) and `hidden` [T, hidden] the final-normed states at those positions -> logits of t_{i+2}
        (as `forward`: last rows or batch.logit_rows) and, with batch.return_hidden, the module's own states."""
        c, m = self.config, self.mtp[depth]
        _, e, cos, sin, token_seq, valid_lens = kernels.step_inputs(
            batch.input_ids, batch.positions, batch.cu_query_lens, self.embedding.weight, m.enorm.weight, m.enorm.eps,
            cached_inv_freq(c.qk_rope_head_dim, c.rope_theta, hidden.device), c.index_topk)
        x = m.eh_proj(torch.cat([e, m.hnorm(hidden)], dim=-1))
        _, h = m.block(x, m.block.attn_norm(x), batch, cache, StepTensors(cos, sin, token_seq, valid_lens),
                       self.final_norm)
        return self._head(h, batch)
