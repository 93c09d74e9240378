"""The kernels the model calls, by the names of `reference.py`: Triton on CUDA when Triton imports,
else the torch reference. `ROOFTOP_KERNELS=reference|triton` forces one (read at each call).

Forcing `triton` on CPU tensors works only under `TRITON_INTERPRET=1` (tiny shapes, tests).
"""

import functools
import os

import torch

from rooftop.engine.kernels import reference

MODES = ("auto", "reference", "triton")


@functools.cache
def triton_available() -> bool:
    """Whether `triton` imports (it is absent on CPU-only installs)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def kernel_mode() -> str:
    """ROOFTOP_KERNELS, checked: auto (default), reference or triton."""
    mode = os.environ.get("ROOFTOP_KERNELS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"ROOFTOP_KERNELS must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def use_triton(t: torch.Tensor) -> bool:
    """Whether a kernel on tensor `t` runs in Triton."""
    mode = kernel_mode()
    if mode == "reference":
        return False
    if mode == "triton":
        if not triton_available():
            raise RuntimeError("ROOFTOP_KERNELS=triton but triton does not import: pip install triton, or unset it")
        return True
    return t.is_cuda and triton_available()


def indexer_topk_decode(q, weights, index_k_cache, block_tables, seq_lens, num_pages: int, topk: int):
    """See `reference.indexer_topk_decode`; the Triton version's time follows seq_lens, not num_pages."""
    if use_triton(q):
        from rooftop.engine.kernels import triton_indexer

        return triton_indexer.indexer_topk_decode(q, weights, index_k_cache, block_tables, seq_lens, num_pages, topk)
    return reference.indexer_topk_decode(q, weights, index_k_cache, block_tables, seq_lens, num_pages, topk)


def indexer_topk_prefill(q, weights, index_k_cache, block_tables, seq_lens, query_lens, positions, topk: int):
    """See `reference.indexer_topk_prefill` (prefill runs eagerly with ragged lengths: reference only)."""
    return reference.indexer_topk_prefill(q, weights, index_k_cache, block_tables, seq_lens, query_lens, positions, topk)


def sparse_mla(q, kv_cache, slots, kv_lora_rank: int, scale: float):
    """See `reference.sparse_mla`; Triton: split-K with a log-sum-exp combine."""
    if use_triton(q):
        from rooftop.engine.kernels import triton_sparse_mla

        return triton_sparse_mla.sparse_mla(q, kv_cache, slots, kv_lora_rank, scale)
    return reference.sparse_mla(q, kv_cache, slots, kv_lora_rank, scale)


def moe_experts(x, topk_ids, topk_weights, w13, w2):
    """See `reference.moe_experts`; Triton: a grouped GEMM with no host synchronisation."""
    if use_triton(x):
        from rooftop.engine.kernels import triton_moe

        return triton_moe.moe_experts(x, topk_ids, topk_weights, w13, w2)
    return reference.moe_experts(x, topk_ids, topk_weights, w13, w2)
