"""Attention-core and indexer work of one layer: (bytes, FLOPs) per GPU for decode and prefill."""

import numpy as np

from rooftop.roofline.config import ModelShape
from rooftop.roofline.dtypes import ACT_BYTES, index_key_bytes, kv_element_bytes, latent_kv_bytes


def kv_heads_per_gpu(shape: ModelShape, tp: int) -> float:
    """GQA KV heads one GPU holds: split until each GPU has one, then replicated."""
    return max(shape.num_kv_heads / tp, 1)


def causal_pairs(length: int, cap: int | None = None, ratio: int = 1) -> int:
    """Sum over query positions i = 1..length of min(i // ratio, cap): (query, key) pairs of a causal pass."""
    i = np.arange(1, length + 1, dtype=np.int64) // ratio
    if cap is not None:
        i = np.minimum(i, cap)
    return int(i.sum())


def _entry_bytes(shape: ModelShape, kv_dtype: str) -> float:
    """Bytes of one cached position of an MLA latent or a V4 K=V entry (shared by all heads)."""
    return latent_kv_bytes(shape.kv_lora_rank, shape.qk_rope_head_dim, kv_dtype)


def csa_positions(shape: ModelShape, layer: int, context: int) -> tuple[int, int]:
    """(window positions, compressed positions) one V4 decode query attends to at `layer`."""
    window = min(context, shape.sliding_window)
    ratio = shape.compress_ratio(layer)
    if not ratio:
        return window, 0
    compressed = context // ratio
    if shape.layer_has_indexer(layer):
        compressed = min(compressed, shape.index_topk)
    return window, compressed


def decode_attention(
    shape: ModelShape, layer: int, batch: int, context: int, tp: int, kv_dtype: str
) -> tuple[float, float]:
    """Scores and values over the cached positions each new token attends to, KV reads included."""
    heads = shape.num_heads / tp
    if shape.attention == "gqa":
        window = shape.window(layer)
        positions = min(context, window) if window else context
        kv_token = kv_heads_per_gpu(shape, tp) * shape.head_dim * 2 * kv_element_bytes(kv_dtype)
        per_seq_bytes = (positions + 1) * kv_token + heads * shape.head_dim * 2 * ACT_BYTES
        return batch * per_seq_bytes, batch * 4.0 * heads * shape.head_dim * positions
    entry = _entry_bytes(shape, kv_dtype)  # shared by all heads: every TP rank reads all of it
    if shape.attention == "mla":
        positions = min(context, shape.index_topk) if shape.layer_has_indexer(layer) else context
        latent, rope = shape.kv_lora_rank, shape.qk_rope_head_dim
        # Absorbed form: scores over latent+rope values, the weighted sum stays in the latent.
        per_seq_bytes = (positions + 1) * entry + heads * (2 * latent + rope) * ACT_BYTES
        return batch * per_seq_bytes, batch * 2.0 * heads * positions * (2 * latent + rope)
    window, compressed = csa_positions(shape, layer, context)
    positions = window + compressed
    per_seq_bytes = (positions + 1) * entry + heads * shape.head_dim * 2 * ACT_BYTES
    return batch * per_seq_bytes, batch * 4.0 * heads * shape.head_dim * positions


def prefill_attention(
    shape: ModelShape, layer: int, batch: int, length: int, tp: int, kv_dtype: str
) -> tuple[float, float]:
    """Causal attention over the prompt: Q/K/V in, O out, the new KV written to the cache."""
    heads = shape.num_heads / tp
    if shape.attention == "gqa":
        pairs = causal_pairs(length, shape.window(layer) or None)
        kvh = kv_heads_per_gpu(shape, tp)
        per_token = (2 * heads + 2 * kvh) * shape.head_dim * ACT_BYTES
        per_token += kvh * shape.head_dim * 2 * kv_element_bytes(kv_dtype)
        return batch * length * per_token, batch * 4.0 * heads * shape.head_dim * pairs
    entry = _entry_bytes(shape, kv_dtype)
    if shape.attention == "mla":
        # Decompressed form: per-head K (nope+rope) and V from kv_b_proj; DSA caps keys at top-k.
        qk, v = shape.qk_nope_head_dim + shape.qk_rope_head_dim, shape.v_head_dim
        pairs = causal_pairs(length, shape.index_topk if shape.layer_has_indexer(layer) else None)
        per_seq_bytes = length * (heads * (2 * qk + 2 * v) * ACT_BYTES + entry)
        return batch * per_seq_bytes, batch * 2.0 * heads * pairs * (qk + v)
    ratio = shape.compress_ratio(layer)
    pairs = causal_pairs(length, shape.sliding_window)
    compressed = 0
    if ratio:
        pairs += causal_pairs(length, shape.index_topk if shape.layer_has_indexer(layer) else None, ratio)
        compressed = length // ratio
    per_seq_bytes = length * (heads * shape.head_dim * 2 * ACT_BYTES + entry) + compressed * entry
    return batch * per_seq_bytes, batch * 4.0 * heads * shape.head_dim * pairs


def _index_ratio(shape: ModelShape, layer: int) -> int:
    return shape.compress_ratio(layer) or 1


def decode_indexer(
    shape: ModelShape, layer: int, batch: int, scored_context: int, kv_dtype: str
) -> tuple[float, float]:
    """Lightning indexer over `scored_context` positions: a key read and an fp32 logit each, then top-k.

    Replicated under TP (one key head, all index heads on every rank).
    """
    n, d = shape.index_n_heads, shape.index_head_dim
    scored = scored_context // _index_ratio(shape, layer)
    key = index_key_bytes(d, kv_dtype)
    per_seq_bytes = (scored + 1) * key + scored * 4 * 2 + shape.index_topk * 4
    return batch * per_seq_bytes, batch * (2.0 * n * d + 3.0 * n) * scored


def prefill_indexer(
    shape: ModelShape, layer: int, batch: int, length: int, kv_dtype: str
) -> tuple[float, float]:
    """Every prompt position scores all earlier (compressed) positions; the fp32 logits are materialised."""
    n, d = shape.index_n_heads, shape.index_head_dim
    ratio = _index_ratio(shape, layer)
    scored = causal_pairs(length, None, ratio)
    per_seq_bytes = 2 * (length // ratio) * index_key_bytes(d, kv_dtype) + scored * 4 * 2
    return batch * per_seq_bytes, batch * (2.0 * n * d + 3.0 * n) * scored
