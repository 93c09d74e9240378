"""Model shapes (HF DeepSeek-V3.2 key names), the `tiny` and `small` presets, and parameter counts."""

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

# Byte tokenizer: ids 0..255 are bytes, then the specials.
BOS_ID, EOS_ID, PAD_ID = 256, 257, 258


@dataclass(slots=True)
class ModelConfig:
    """Shapes of a DeepSeek-V3.2-style model: MLA + lightning indexer + sparse attention + MoE."""

    vocab_size: int = 320
    hidden_size: int = 256
    num_hidden_layers: int = 4
    first_k_dense_replace: int = 1
    intermediate_size: int = 512
    moe_intermediate_size: int = 128
    n_routed_experts: int = 8
    n_shared_experts: int = 1
    num_experts_per_tok: int = 2
    num_attention_heads: int = 4
    q_lora_rank: int = 128
    kv_lora_rank: int = 64
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 16
    v_head_dim: int = 32
    index_n_heads: int = 8
    index_head_dim: int = 32
    index_topk: int = 64
    max_position_embeddings: int = 1048576
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    scoring_func: str = "sigmoid"  # router gate: "sigmoid" (V3) or "softmax"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    hidden_act: str = "silu"
    # DeepSeek-V3's multi-token prediction modules (HF key): 0 = none; each is one decoder layer over the
    # previous hidden state and the next token's embedding, sharing the embedding and head (model/mtp.py)
    num_nextn_predict_layers: int = 0
    bos_token_id: int = BOS_ID
    eos_token_id: int = EOS_ID
    pad_token_id: int = PAD_ID
    architectures: list[str] = field(default_factory=lambda: ["RooftopDSAForCausalLM"])
    model_type: str = "rooftop_dsa"

    def __post_init__(self):
        if self.qk_rope_head_dim > self.index_head_dim:
            raise ValueError("qk_rope_head_dim must fit in index_head_dim (the indexer's partial RoPE)")
        if self.scoring_func not in ("sigmoid", "softmax"):
            raise ValueError(f"scoring_func must be sigmoid or softmax, not {self.scoring_func!r}")

    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key width in the decompressed form (no-RoPE + RoPE)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_cache_dim(self) -> int:
        """Values cached per token per layer for attention: latent + shared RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @classmethod
    def preset(cls, name: str) -> "ModelConfig":
        """A fresh copy of a named preset ("tiny" or "small")."""
        if name not in PRESETS:
            raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[name], architectures=list(PRESETS[name].architectures))

    def to_dict(self) -> dict:
        """HF-style config.json contents."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        """Build from HF-style keys, ignoring keys this model does not use (e.g. torch_dtype)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_json(self, path: str | Path) -> None:
        """Write an HF-style config.json."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        """Read an HF-style config.json (a file, or a directory holding one)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        return cls.from_dict(json.loads(path.read_text()))


PRESETS: dict[str, ModelConfig] = {
    # CPU tests and demo: small dense parts, but an indexer (8 heads x 32) whose scoring of a
    # 65536-token capacity clearly outweighs the rest of a layer.
    "tiny": ModelConfig(num_nextn_predict_layers=1),
    # One H200: ~1.8B parameters, V3.2-like attention and indexer shapes.
    "small": ModelConfig(
        vocab_size=512,
        hidden_size=2048,
        num_hidden_layers=16,
        first_k_dense_replace=1,
        intermediate_size=5632,
        moe_intermediate_size=512,
        n_routed_experts=32,
        n_shared_experts=1,
        num_experts_per_tok=4,
        num_attention_heads=32,
        q_lora_rank=768,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        index_n_heads=32,
        index_head_dim=128,
        index_topk=2048,
        num_nextn_predict_layers=1,
    ),
}


@dataclass(slots=True)
class ParamCount:
    """Parameter counts of a config: all of the main model's, those one token touches, and the MTP modules'
    (apart, as DeepSeek-V3 counts them: they run only when the engine speculates with `mtp`)."""

    total: int
    active_per_token: int
    mtp: int = 0


def count_params(c: ModelConfig) -> ParamCount:
    """Count parameters analytically from the config (matches the built model's numel)."""
    h = c.hidden_size
    attn = (
        h * c.q_lora_rank
        + c.q_lora_rank  # q_a_norm
        + c.q_lora_rank * c.num_attention_heads * c.qk_head_dim
        + h * c.kv_cache_dim
        + c.kv_lora_rank  # kv_a_norm
        + c.kv_lora_rank * c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim)
        + c.num_attention_heads * c.v_head_dim * h
    )
    indexer = (
        c.q_lora_rank * c.index_n_heads * c.index_head_dim
        + h * c.index_head_dim
        + c.index_head_dim  # k_norm
        + h * c.index_n_heads
    )
    norms = 2 * h  # attn_norm, ffn_norm
    dense_mlp = 3 * h * c.intermediate_size
    expert = 3 * h * c.moe_intermediate_size
    router = h * c.n_routed_experts
    shared = c.n_shared_experts * expert
    n_dense = min(c.first_k_dense_replace, c.num_hidden_layers)
    n_moe = c.num_hidden_layers - n_dense
    per_layer_common = attn + indexer + norms
    embed = c.vocab_size * h
    head = 0 if c.tie_word_embeddings else c.vocab_size * h
    outer = embed + head + h  # final_norm
    total = outer + n_dense * (per_layer_common + dense_mlp)
    total += n_moe * (per_layer_common + router + shared + c.n_routed_experts * expert)
    active = outer + n_dense * (per_layer_common + dense_mlp)
    active += n_moe * (per_layer_common + router + shared + c.num_experts_per_tok * expert)
    # an MTP module: enorm, hnorm, eh_proj [h, 2h], and a decoder layer at index num_hidden_layers + i
    mtp = 0
    for i in range(c.num_nextn_predict_layers):
        dense = c.num_hidden_layers + i < c.first_k_dense_replace
        ffn = dense_mlp if dense else router + shared + c.n_routed_experts * expert
        mtp += 2 * h + 2 * h * h + per_layer_common + ffn
    return ParamCount(total=total, active_per_token=active, mtp=mtp)


if __name__ == "__main__":
    for name in PRESETS:
        n = count_params(PRESETS[name])
        print(f"{name}: {n.total:,} parameters ({n.total / 1e9:.3f} B), "
              f"{n.active_per_token:,} active per token ({n.active_per_token / 1e9:.3f} B), {n.mtp:,} in MTP")
