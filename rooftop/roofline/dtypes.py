"""Bytes per element of weights, KV caches and activations, scale overhead included."""

from rooftop.errors import RooftopError

# Bytes per element, block scales spread over the elements they cover. The per-tensor scale of
# NVFP4 (one fp32 per tensor) does not depend on the element count: `tensor_bytes` adds it.
BYTES_PER_ELEMENT: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    # DeepSeek-style fp8: one fp32 scale per 128x128 block.
    "fp8": 1.0 + 4.0 / (128 * 128),
    # int8 weights with one fp16 scale per output channel; negligible per element at LLM widths.
    "int8": 1.0,
    # NVFP4: e2m1 values, one fp8 (e4m3) scale per 16 elements, plus an fp32 per tensor.
    "nvfp4": 0.5 + 1.0 / 16,
    # MXFP4 (OCP microscaling): e2m1 values, one e8m0 scale byte per 32 elements.
    "mxfp4": 0.5 + 1.0 / 32,
    # int4 group-wise (GPTQ/AWQ style): group 128, fp16 scale and fp16 zero point per group.
    "int4": 0.5 + 4.0 / 128,
}

PER_TENSOR_BYTES: dict[str, int] = {"nvfp4": 4}

ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "fp8_e4m3": "fp8",
    "fp8_e4m3fn": "fp8",
    "float8_e4m3fn": "fp8",
    "e4m3": "fp8",
    # vLLM's --kv-cache-dtype fp8_e5m2: one byte per element, as e4m3.
    "fp8_e5m2": "fp8",
    "float8_e5m2": "fp8",
    "e5m2": "fp8",
    "float8": "fp8",
    "fp4": "nvfp4",
    "w4a16": "int4",
    "gptq": "int4",
    "awq": "int4",
}

# The tensor-core dtype a matmul with these weights runs in, best case (a floor): fp4 runs as fp4
# where the GPU has fp4 units (GPUSpec.peak_flops falls back to fp8, then bf16); int4 group-wise
# kernels (Marlin, AWQ) dequantise to 16-bit and multiply there.
COMPUTE_DTYPE = {
    "fp32": "fp32",
    "bf16": "bf16",
    "fp16": "fp16",
    "fp8": "fp8",
    "int8": "int8",
    "nvfp4": "fp4",
    "mxfp4": "fp4",
    "int4": "bf16",
}

ACT_BYTES = 2  # activations are bf16 between kernels


def normalize_dtype(name: str) -> str:
    """Canonical dtype name ('bf16', 'fp8', 'nvfp4', ...) for a lenient spelling."""
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key).replace("_", "")
    if key not in BYTES_PER_ELEMENT:
        known = ", ".join(BYTES_PER_ELEMENT)
        raise RooftopError(f"unknown dtype {name!r}", f"use one of: {known}")
    return key


def bytes_per_element(dtype: str) -> float:
    """Bytes per stored element of `dtype`, block scales included."""
    return BYTES_PER_ELEMENT[normalize_dtype(dtype)]


def tensor_bytes(numel: float, dtype: str, n_tensors: int = 1) -> float:
    """Bytes of `n_tensors` tensors holding `numel` elements in all, in `dtype`."""
    dtype = normalize_dtype(dtype)
    return numel * BYTES_PER_ELEMENT[dtype] + n_tensors * PER_TENSOR_BYTES.get(dtype, 0)


def compute_dtype(weight_dtype: str) -> str:
    """The tensor-core dtype a matmul against `weight_dtype` weights runs in, at best."""
    return COMPUTE_DTYPE[normalize_dtype(weight_dtype)]


def latent_kv_bytes(latent_dim: int, rope_dim: int, kv_dtype: str) -> float:
    """Bytes per cached token of an MLA-style latent: the no-RoPE part in kv_dtype, RoPE in bf16.

    FlashMLA's fp8 cache layout: fp8 latent, one fp32 scale per 128 values, bf16 RoPE part
    (512 + 16 + 128 = 656 bytes for DeepSeek-V3).
    """
    kv_dtype = normalize_dtype(kv_dtype)
    if kv_dtype in ("bf16", "fp16", "fp32"):
        return (latent_dim + rope_dim) * BYTES_PER_ELEMENT[kv_dtype]
    if kv_dtype == "fp8":
        return latent_dim * 1 + -(-latent_dim // 128) * 4 + rope_dim * 2
    raise RooftopError(f"KV dtype {kv_dtype} is not modelled for latent caches", "use bf16 or fp8")


def index_key_bytes(index_head_dim: int, kv_dtype: str) -> float:
    """Bytes per cached indexer key: fp8 with one fp32 scale (DeepSeek-V3.2), or 16-bit."""
    kv_dtype = normalize_dtype(kv_dtype)
    if kv_dtype == "fp8":
        return index_head_dim + 4
    return index_head_dim * 2


def kv_element_bytes(kv_dtype: str) -> float:
    """Bytes per element of a plain (GQA) KV cache; fp8 uses a per-tensor scale."""
    kv_dtype = normalize_dtype(kv_dtype)
    if kv_dtype not in ("bf16", "fp16", "fp32", "fp8"):
        raise RooftopError(f"KV dtype {kv_dtype} is not modelled", "use bf16 or fp8")
    return 1.0 if kv_dtype == "fp8" else BYTES_PER_ELEMENT[kv_dtype]
