"""Read an HF config.json into one normalised ModelShape (dense GQA, MoE, MLA, DSA, DeepSeek-V4)."""

import json
from dataclasses import dataclass, field
from pathlib import Path

from rooftop.errors import RooftopError
from rooftop.roofline.quant import stored_dtypes


@dataclass(slots=True)
class ModelShape:
    """What the roofline needs of a model; sizes in elements, lengths in tokens."""

    model_type: str
    attention: str  # "gqa" | "mla" (DeepSeek-V2/V3/V3.2) | "csa" (DeepSeek-V4 compressed + window)
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int = 0  # dense MLP width
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm on q and k per head
    gated_mlp: bool = True  # gate, up, down (SwiGLU, GeGLU); False: up and down (GPT-NeoX, GPT-2, Phi-2)
    mlp_bias: bool = False
    norm_bias: bool = False  # LayerNorm (weight and bias) instead of RMSNorm
    norms_per_layer: int = 2  # Gemma-2/3: 4 (pre and post norms); Phi-2, Falcon-7B: 1 (parallel blocks)
    sliding_window: int = 0  # 0 = full attention
    # Per layer, where layers differ (layer_types, Gemma-2's alternation): the window, 0 = full.
    layer_windows: tuple[int, ...] = ()
    # MLA (DeepSeek-V2/V3): the cache holds kv_lora_rank + qk_rope_head_dim values per token.
    q_lora_rank: int = 0  # 0 = q projected straight from the hidden state
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # DeepSeek-V4: grouped low-rank output projection, per-layer KV compression ratio.
    o_lora_rank: int = 0
    o_groups: int = 0
    compress_ratios: tuple[int, ...] = ()  # per layer; 0 = sliding window only
    hc_mult: int = 0  # hyper-connection residual streams
    # Lightning indexer (DeepSeek-V3.2 DSA on every layer; V4 on the ratio-4 layers).
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    indexer_layers: tuple[bool, ...] = ()
    # MoE
    moe_layers: tuple[bool, ...] = ()
    n_routed_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    n_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0  # width of the shared expert block (all shared experts)
    router_bias: bool = False  # DeepSeek noaux_tc: a per-expert correction bias
    mtp_layers: int = 0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 0
    weight_dtype: str = "bf16"  # as the checkpoint stores it (quantization_config / torch_dtype)
    expert_dtype: str = "bf16"
    base_dtype: str = "bf16"  # what modules the quantization leaves alone are stored in
    quant_skip: tuple[str, ...] = ()  # modules_to_not_convert / ignore patterns (rooftop.roofline.quant)
    notes: list[str] = field(default_factory=list)  # assumptions the config left to rooftop, and warnings

    @property
    def is_moe(self) -> bool:
        """True when any layer routes to experts."""
        return any(self.moe_layers)

    def window(self, layer: int) -> int:
        """Sliding window of `layer` in tokens (0 = full attention)."""
        return self.layer_windows[layer] if self.layer_windows else self.sliding_window

    def layer_has_indexer(self, layer: int) -> bool:
        """True when `layer` runs a lightning indexer."""
        return bool(self.indexer_layers) and self.indexer_layers[layer]

    def compress_ratio(self, layer: int) -> int:
        """KV compression ratio of `layer` (0 = none)."""
        return self.compress_ratios[layer] if self.compress_ratios else 0


BASE_KEYS = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"]
MLA_KEYS = ["kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"]
DSA_KEYS = ["index_n_heads", "index_head_dim", "index_topk"]
V4_KEYS = [
    "head_dim",
    "qk_rope_head_dim",
    "q_lora_rank",
    "o_lora_rank",
    "o_groups",
    "sliding_window",
    "compress_ratios",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    *DSA_KEYS,
]
GQA_FAMILIES = {"llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "qwen2_moe", "llama4", "llama4_text"}
MLA_FAMILIES = {"deepseek_v2", "deepseek_v3", "deepseek_v32", "rooftop_dsa"}
# Two-matrix MLPs (up, activation, down) with biases and LayerNorm.
NON_GATED_FAMILIES = {"gpt_neox", "gpt2", "gpt_bigcode", "starcoder2", "phi", "falcon", "opt", "bloom", "gptj",
                      "gpt_neo", "codegen", "mpt"}  # fmt: skip
OTHER_FAMILIES = {"gemma", "gemma2", "gemma3", "gemma3_text", "gpt_oss", "phi3"}
KNOWN_FAMILIES = GQA_FAMILIES | MLA_FAMILIES | NON_GATED_FAMILIES | OTHER_FAMILIES | {"deepseek_v4"}
# Families whose HF config class ties the LM head to the embedding when the key is absent.
TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text", "gpt2", "gpt_bigcode", "starcoder2", "falcon", "opt",
                   "bloom", "gpt_neo", "mpt"}  # fmt: skip
# GPT-2-era key names (GPT-2, GPT-BigCode, Falcon) for the ones the roofline reads.
KEY_ALIASES = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
               "n_inner": "intermediate_size", "n_positions": "max_position_embeddings"}  # fmt: skip


def load_model_shape(path: str | Path) -> ModelShape:
    """Read a config.json (or a directory holding one) into a ModelShape."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise RooftopError(
            f"model config {path} not found",
            "pass --model-config pointing at a config.json or the model directory holding it",
        )
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RooftopError(
            f"{path} is not valid JSON ({exc})", "point at the model's HF config.json"
        ) from None
    if not isinstance(cfg, dict):
        raise RooftopError(f"{path} does not hold a JSON object", "point at the model's HF config.json")
    return shape_from_config(cfg, source=str(path))


def shape_from_config(cfg: dict, source: str = "config") -> ModelShape:
    """Normalise an HF config dict; the family comes from model_type, else from the keys present."""
    outer = cfg
    cfg = cfg.get("text_config", cfg) if "hidden_size" not in cfg and "n_embd" not in cfg else cfg
    cfg = _with_aliases(cfg)
    model_type = str(cfg.get("model_type", ""))
    arch = ", ".join(cfg.get("architectures") or []) or model_type or "unknown"
    if model_type == "deepseek_v4" or "compress_ratios" in cfg:
        family, required = "csa", BASE_KEYS + V4_KEYS
    elif model_type in MLA_FAMILIES or "kv_lora_rank" in cfg:
        family, required = "mla", BASE_KEYS + MLA_KEYS + (DSA_KEYS if _wants_indexer(cfg) else [])
    else:
        family, required = "gqa", BASE_KEYS + ["intermediate_size"]
    missing = [key for key in required if cfg.get(key) is None]
    if missing:
        known = "" if model_type in KNOWN_FAMILIES else " (architecture not recognised)"
        raise RooftopError(
            f"{source}: {arch}{known} lacks {', '.join(missing)}",
            f"a {family.upper()} config needs {', '.join(required)}",
        )
    try:
        return _build(cfg, family, model_type, source, arch, outer)
    except (TypeError, ValueError) as exc:
        raise RooftopError(
            f"{source}: a size in {arch} is not a number ({exc})", "fix the value in config.json"
        ) from None


def _build(cfg: dict, family: str, model_type: str, source: str, arch: str, outer: dict) -> ModelShape:
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    shape = ModelShape(
        model_type=model_type or "unknown",
        attention=family,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(cfg.get("intermediate_size") or 0),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", model_type in TIED_BY_DEFAULT)),
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 0),
        mtp_layers=int(cfg.get("num_nextn_predict_layers") or 0),
    )
    stored = stored_dtypes(cfg, outer)
    shape.weight_dtype, shape.expert_dtype, shape.base_dtype = stored.weight, stored.expert, stored.base
    shape.quant_skip = stored.skip
    shape.notes += stored.notes
    if model_type not in KNOWN_FAMILIES:
        shape.notes.append(
            f"model_type {model_type or '(none)'!r} not recognised: read as a Llama-style decoder (gated MLP, "
            f"RMSNorm, {'tied' if shape.tie_word_embeddings else 'untied'} embeddings); check the parameter count"
        )
    if family == "gqa":
        _read_gqa(cfg, shape)
    else:
        _read_deepseek(cfg, shape, family)
    _read_moe(cfg, shape, source, arch)
    return shape


def _with_aliases(cfg: dict) -> dict:
    """`cfg` with GPT-2-era keys copied to the names the roofline reads; n_inner null means 4 x hidden."""
    out = dict(cfg)
    for old, new in KEY_ALIASES.items():
        if out.get(new) is None and out.get(old) is not None:
            out[new] = out[old]
    if "n_embd" in cfg and out.get("intermediate_size") is None and out.get("hidden_size"):
        out["intermediate_size"] = 4 * int(out["hidden_size"])
    if cfg.get("model_type") == "falcon" and out.get("intermediate_size") is None and out.get("hidden_size"):
        out["intermediate_size"] = int(cfg.get("ffn_hidden_size") or 4 * int(out["hidden_size"]))
    return out


def _wants_indexer(cfg: dict) -> bool:
    return cfg.get("model_type") in ("deepseek_v32", "rooftop_dsa") or any(k in cfg for k in DSA_KEYS)


def _read_gqa(cfg: dict, shape: ModelShape) -> None:
    model_type = shape.model_type
    non_gated = model_type in NON_GATED_FAMILIES
    # Biases: GPT-NeoX's attention_bias defaults on; StarCoder2 says use_bias, Falcon bias; GPT-2-era
    # and Phi-2 have them throughout.
    bias = cfg.get("attention_bias", cfg.get("use_bias", cfg.get("bias")))
    bias = bool(bias) if bias is not None else model_type in ("gpt_neox", "gpt2", "gpt_bigcode", "phi", "opt",
                                                             "bloom", "gpt_neo", "codegen")  # fmt: skip
    # Qwen2 has q/k/v biases without a config key; Llama's attention_bias puts one on o as well.
    shape.qkv_bias = model_type in ("qwen2", "qwen2_moe") or bias
    shape.o_bias = bias and model_type not in ("qwen2", "qwen2_moe")
    shape.qk_norm = model_type in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text")
    shape.gated_mlp = not non_gated
    mlp_bias = cfg.get("mlp_bias", cfg.get("use_bias", cfg.get("bias")))
    shape.mlp_bias = bool(mlp_bias) if mlp_bias is not None else (non_gated and bias)
    shape.norm_bias = non_gated
    if model_type in ("gemma2", "gemma3", "gemma3_text"):
        shape.norms_per_layer = 4
    elif model_type == "phi" or (model_type == "falcon" and not cfg.get("new_decoder_architecture")):
        shape.norms_per_layer = 1  # attention and MLP in parallel off one LayerNorm
    if model_type in ("gpt_bigcode", "falcon") and cfg.get("multi_query") and not cfg.get("new_decoder_architecture"):
        shape.num_kv_heads = 1
    elif model_type == "falcon" and cfg.get("num_kv_heads"):
        shape.num_kv_heads = int(cfg["num_kv_heads"])
    # Qwen2 writes sliding_window but only uses it when use_sliding_window is true.
    window = cfg.get("sliding_window")
    if window and cfg.get("use_sliding_window", True):
        shape.sliding_window = int(window)
    shape.layer_windows = _layer_windows(cfg, shape)


def _layer_windows(cfg: dict, shape: ModelShape) -> tuple[int, ...]:
    """Per-layer windows where layers differ: `layer_types` (GPT-OSS, Gemma-3, newer configs), else
    Gemma-2's alternation (even layers local) and Gemma-3's pattern (every Nth layer global)."""
    window, layers = shape.sliding_window, shape.num_layers
    types = cfg.get("layer_types")
    if types:
        types = list(types)[:layers]
        types += [types[-1] if types else "full_attention"] * (layers - len(types))
        unknown = sorted({t for t in types if t not in ("sliding_attention", "full_attention")})
        if unknown:
            shape.notes.append(
                f"layer_types {', '.join(map(str, unknown))} not modelled: those layers costed as full attention"
            )
        return tuple(window if t == "sliding_attention" else 0 for t in types)
    if not window:
        return ()
    if shape.model_type.startswith("qwen") and cfg.get("max_window_layers") is not None:
        # Qwen2/3 slide only from layer max_window_layers on (HF's layer_types rule).
        first = int(cfg["max_window_layers"])
        return tuple(window if layer >= first else 0 for layer in range(layers))
    if shape.model_type == "gemma2":
        return tuple(window if layer % 2 == 0 else 0 for layer in range(layers))
    pattern = int(cfg.get("sliding_window_pattern") or 6)  # Gemma-3's default: 5 local, 1 global
    if shape.model_type in ("gemma3", "gemma3_text") and pattern > 1:
        return tuple(0 if (layer + 1) % pattern == 0 else window for layer in range(layers))
    return ()


def _read_deepseek(cfg: dict, shape: ModelShape, family: str) -> None:
    shape.q_lora_rank = int(cfg.get("q_lora_rank") or 0)
    shape.qk_rope_head_dim = int(cfg["qk_rope_head_dim"])
    if family == "mla":
        shape.kv_lora_rank = int(cfg["kv_lora_rank"])
        shape.qk_nope_head_dim = int(cfg["qk_nope_head_dim"])
        shape.v_head_dim = int(cfg["v_head_dim"])
        shape.head_dim = shape.qk_nope_head_dim + shape.qk_rope_head_dim
        if _wants_indexer(cfg):
            shape.indexer_layers = (True,) * shape.num_layers
    else:
        # V4: one shared K=V head of head_dim (NoPE part + RoPE part), no kv_b up-projection.
        shape.num_kv_heads = 1
        shape.kv_lora_rank = shape.head_dim - shape.qk_rope_head_dim
        shape.qk_nope_head_dim = shape.kv_lora_rank
        shape.v_head_dim = shape.head_dim
        shape.o_lora_rank = int(cfg["o_lora_rank"])
        shape.o_groups = int(cfg["o_groups"])
        shape.sliding_window = int(cfg["sliding_window"])
        shape.hc_mult = int(cfg.get("hc_mult") or 0)
        # The list may run past the layers (the tail covers MTP layers); keep the main layers'.
        ratios = tuple(int(r) for r in cfg["compress_ratios"])[: shape.num_layers]
        shape.compress_ratios = ratios + (0,) * (shape.num_layers - len(ratios))
        # The indexer picks top-k among the ratio-4 entries; ratio-128 layers attend to all of theirs.
        shape.indexer_layers = tuple(r == 4 for r in shape.compress_ratios)
    if shape.indexer_layers:
        shape.index_n_heads = int(cfg["index_n_heads"])
        shape.index_head_dim = int(cfg["index_head_dim"])
        shape.index_topk = int(cfg["index_topk"])
    shape.router_bias = cfg.get("topk_method") == "noaux_tc"


def _read_moe(cfg: dict, shape: ModelShape, source: str, arch: str) -> None:
    n_experts = int(
        cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts") or 0
    )
    if n_experts == 0:
        shape.moe_layers = (False,) * shape.num_layers
        if shape.intermediate_size == 0:
            raise RooftopError(
                f"{source}: {arch} lacks intermediate_size", "a dense model needs its MLP width"
            )
        return
    missing = [k for k in ["num_experts_per_tok"] if not cfg.get(k)]
    # Mixtral sizes its experts with intermediate_size; DeepSeek and Qwen-MoE with moe_intermediate_size.
    expert_width = cfg.get("moe_intermediate_size") or (
        cfg.get("intermediate_size") if "num_local_experts" in cfg else None
    )
    if not expert_width:
        missing.append("moe_intermediate_size")
    if missing:
        raise RooftopError(
            f"{source}: {arch} has {n_experts} experts but lacks {', '.join(missing)}",
            "an MoE config needs num_experts_per_tok and the expert width",
        )
    shape.n_routed_experts = n_experts
    shape.experts_per_token = int(cfg["num_experts_per_tok"])
    shape.moe_intermediate_size = int(expert_width)
    shape.n_shared_experts = int(cfg.get("n_shared_experts") or 0)
    if shape.model_type.startswith("llama4"):
        _read_llama4(cfg, shape)
    else:
        first_dense = int(cfg.get("first_k_dense_replace") or 0)
        freq = int(cfg.get("moe_layer_freq") or 1)
        step = int(cfg.get("decoder_sparse_step") or 1)
        dense_only = set(cfg.get("mlp_only_layers") or [])
        shape.moe_layers = tuple(
            layer >= first_dense and layer % freq == 0 and (layer + 1) % step == 0 and layer not in dense_only
            for layer in range(shape.num_layers)
        )
    shape.shared_expert_intermediate_size = int(
        cfg.get("shared_expert_intermediate_size") or shape.n_shared_experts * shape.moe_intermediate_size
    )
    if not all(shape.moe_layers) and shape.intermediate_size == 0:
        raise RooftopError(
            f"{source}: {arch} has dense layers but lacks intermediate_size", "add the dense MLP width"
        )


def _read_llama4(cfg: dict, shape: ModelShape) -> None:
    """Llama-4: MoE every interleave_moe_layer_step-th layer (or the moe_layers list), each with one
    shared expert as wide as the routed ones; the other layers' MLPs are intermediate_size_mlp wide."""
    step = int(cfg.get("interleave_moe_layer_step") or 1)
    moe = set(cfg.get("moe_layers") or range(step - 1, shape.num_layers, step))
    shape.moe_layers = tuple(layer in moe for layer in range(shape.num_layers))
    shape.n_shared_experts = 1
    shape.intermediate_size = int(cfg.get("intermediate_size_mlp") or 0)
    if cfg.get("attention_chunk_size") and not cfg.get("layer_types"):
        shape.notes.append(
            f"chunked attention (attention_chunk_size {cfg['attention_chunk_size']}) costed as full attention"
        )
