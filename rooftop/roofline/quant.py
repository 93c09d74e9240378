"""What a checkpoint stores its weights in: quantization_config and torch_dtype read into dtypes, and
the modules a quantization leaves alone (modules_to_not_convert, ignore) matched against each weight."""

import functools
import re
from dataclasses import dataclass, field

# torch_dtype -> rooftop dtype. float32 checkpoints are served in bf16: vLLM and SGLang cast a
# float32 config to bfloat16 under --dtype auto.
TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "bf16", "float": "bf16"}


@dataclass(slots=True)
class StoredDtypes:
    """The dtype of quantised weights, of routed experts, of what stays unquantised, and what does."""

    weight: str
    expert: str
    base: str  # what modules left out of the quantization (and unquantised checkpoints) are stored in
    skip: tuple[str, ...] = ()  # module-name patterns the quantization leaves in `base`
    notes: list[str] = field(default_factory=list)


def stored_dtypes(cfg: dict, outer: dict | None = None) -> StoredDtypes:
    """Read quantization_config and torch_dtype of `cfg` (or of the wrapping `outer` config, where a
    multimodal checkpoint keeps them beside text_config)."""
    outer = outer or cfg
    notes: list[str] = []
    raw = str(cfg.get("torch_dtype") or cfg.get("dtype") or outer.get("torch_dtype") or outer.get("dtype")
              or "bfloat16").removeprefix("torch.")  # fmt: skip
    base = TORCH_DTYPES.get(raw)
    if base is None:
        notes.append(f"torch_dtype {raw!r} not recognised: weights costed as bf16")
        base = "bf16"
    elif raw in ("float32", "float"):
        notes.append(
            "torch_dtype float32: vLLM and SGLang serve float32 checkpoints in bf16 under --dtype auto, "
            "so the weights are costed as bf16"
        )
    quant = cfg.get("quantization_config") or outer.get("quantization_config") or {}
    weight, expert = _quantized(quant, base, notes)
    skip = tuple(
        str(p)
        for key in ("modules_to_not_convert", "ignore", "exclude_modules", "llm_int8_skip_modules")
        for p in (quant.get(key) or [])
    )
    marked = str(cfg.get("expert_dtype", "")).lower()  # DeepSeek-V4: fp4 experts in an fp8 checkpoint
    expert = {"fp4": "mxfp4", "mxfp4": "mxfp4", "nvfp4": "nvfp4", "fp8": "fp8"}.get(marked, expert)
    return StoredDtypes(weight, expert, base, skip, notes)


def _quantized(quant: dict, base: str, notes: list[str]) -> tuple[str, str]:
    """(weight dtype, expert dtype) a quantization_config gives; `base` where it quantises nothing."""
    if not quant:
        return base, base
    method = str(quant.get("quant_method", "")).lower().replace("_", "-")
    algo = str(quant.get("quant_algo", "")).lower()
    if method == "compressed-tensors":
        return _compressed_tensors(quant, base, notes)
    if method in ("fp8", "fbgemm-fp8") or algo == "fp8":
        return "fp8", "fp8"
    if method == "mxfp4":
        return "mxfp4", "mxfp4"
    if method == "nvfp4" or algo == "nvfp4":
        return "nvfp4", "nvfp4"
    if method in ("gptq", "awq"):
        bits = int(quant.get("bits") or quant.get("w_bit") or 4)
        dtype = {4: "int4", 8: "int8"}.get(bits)
        if dtype:
            return dtype, dtype
        notes.append(f"{method} {bits}-bit weights not modelled: costed as {base}; pass --weight-dtype")
        return base, base
    if method == "bitsandbytes":
        if quant.get("load_in_4bit"):
            notes.append("bitsandbytes 4-bit (nf4/fp4, block-wise absmax) costed as int4 group-wise")
            return "int4", "int4"
        if quant.get("load_in_8bit"):
            return "int8", "int8"
    what = f"quant_method {method!r}" + (f", quant_algo {algo!r}" if algo else "") if method else "no quant_method"
    notes.append(
        f"quantization_config ({what}) not recognised: weights costed as {base}, which overstates their "
        "bytes if they are quantised; pass --weight-dtype (and --expert-dtype) to set them"
    )
    return base, base


def _compressed_tensors(quant: dict, base: str, notes: list[str]) -> tuple[str, str]:
    """compressed-tensors: each config group quantises its targets' weights to num_bits of a type."""
    weight = expert = None
    fmt = str(quant.get("format", "")).lower()
    for name, group in (quant.get("config_groups") or {}).items():
        spec = group.get("weights") or {}
        dtype = _ct_weight_dtype(spec, str(group.get("format") or fmt).lower())
        if dtype is None:
            notes.append(f"compressed-tensors group {name} ({spec.get('num_bits')}-bit {spec.get('type')}) "
                         f"not modelled: its weights costed as {base}")  # fmt: skip
            dtype = base
        targets = [str(t) for t in group.get("targets") or []]
        if targets and all("expert" in t for t in targets):
            expert = dtype
        else:
            weight = weight or dtype
    weight = weight or base
    return weight, expert or weight


def _ct_weight_dtype(spec: dict, fmt: str) -> str | None:
    bits, kind = int(spec.get("num_bits") or 0), str(spec.get("type", "int")).lower()
    if bits == 8:
        return "fp8" if kind == "float" else "int8"
    if bits == 4 and kind == "float":
        # NVFP4: fp8 scale per 16 values; MXFP4: e8m0 scale per 32.
        return "mxfp4" if "mxfp4" in fmt or spec.get("group_size") == 32 else "nvfp4"
    if bits == 4:
        return "int4"
    return None


# HF module names a weight of weights.py goes by, per Linear.name, "{i}" the layer. Several
# spellings (Llama/Qwen/DeepSeek "mlp", Llama-4 "feed_forward", Mixtral "block_sparse_moe").
_MODULES = {
    "q_proj": ["self_attn.q_proj"], "k_proj": ["self_attn.k_proj"], "v_proj": ["self_attn.v_proj"],
    "o_proj": ["self_attn.o_proj"], "q_a_proj": ["self_attn.q_a_proj"], "q_b_proj": ["self_attn.q_b_proj"],
    "kv_a_proj": ["self_attn.kv_a_proj_with_mqa"], "kv_b_proj": ["self_attn.kv_b_proj"],
    "wq_b": ["attn.wq_b"], "wkv": ["attn.wkv"], "wo_a": ["attn.wo_a"], "wo_b": ["attn.wo_b"],
    "compressor_wkv": ["attn.compressor.wkv"], "compressor_wgate": ["attn.compressor.wgate"],
    "router": ["mlp.gate", "mlp.router", "block_sparse_moe.gate", "feed_forward.router"],
    "dense_mlp.gate_up": ["mlp.gate_proj", "mlp.up_proj", "feed_forward.gate_proj", "feed_forward.up_proj",
                          "mlp.fc1", "mlp.dense_h_to_4h", "mlp.c_fc"],
    "dense_mlp.up": ["mlp.up_proj", "mlp.fc1", "mlp.dense_h_to_4h", "mlp.c_fc"],
    "dense_mlp.down": ["mlp.down_proj", "feed_forward.down_proj", "mlp.fc2", "mlp.dense_4h_to_h", "mlp.c_proj"],
    "shared_experts.gate_up": ["mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj",
                               "mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj",
                               "feed_forward.shared_expert.gate_proj", "feed_forward.shared_expert.up_proj"],
    "shared_experts.down": ["mlp.shared_experts.down_proj", "mlp.shared_expert.down_proj",
                            "feed_forward.shared_expert.down_proj"],
    "experts": ["mlp.experts.0.gate_proj", "mlp.experts.0.up_proj", "mlp.experts.0.down_proj",
                "mlp.experts.gate_up_proj", "mlp.experts.down_proj", "block_sparse_moe.experts.0.w1",
                "block_sparse_moe.experts.0.w2", "block_sparse_moe.experts.0.w3",
                "feed_forward.experts.gate_up_proj", "feed_forward.experts.down_proj"],
}  # fmt: skip


def module_names(linear: str, layer: int) -> tuple[str, ...]:
    """HF module names of weight `linear` (a weights.py Linear.name, or "experts") in `layer`."""
    if linear.startswith("index_"):
        return (f"model.layers.{layer}.self_attn.indexer.{linear.removeprefix('index_')}",)
    return tuple(f"model.layers.{layer}.{m}" for m in _MODULES.get(linear, [f"self_attn.{linear}"]))


@functools.cache
def left_unquantized(patterns: tuple[str, ...], names: tuple[str, ...]) -> bool:
    """True when a pattern of modules_to_not_convert / ignore names any of `names`.

    A pattern is a module path, glob ("model.layers.*.self_attn") or compressed-tensors regex
    ("re:.*mlp.gate$"); a path names its module and everything under it, wherever it starts
    ("lm_head", "mlp.router"); multimodal prefixes ("language_model.") are dropped.
    """
    return any(_match(p, n) for p in patterns for n in names)


@functools.cache
def _pattern(pattern: str) -> re.Pattern:
    if pattern.startswith("re:"):
        return re.compile(pattern[3:])
    path = re.sub(r"(^|\.)language_model\.", r"\1", pattern).removeprefix("model.")
    glob = re.escape(path).replace(r"\*", ".*")
    return re.compile(rf"(?:.*\.)?{glob}(?:\..*)?")


def _match(pattern: str, name: str) -> bool:
    compiled = _pattern(pattern)
    if pattern.startswith("re:"):
        return bool(compiled.match(name) or compiled.match(name.removeprefix("model.")))
    return bool(compiled.fullmatch(name))
