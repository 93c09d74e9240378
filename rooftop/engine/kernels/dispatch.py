"""The kernels the model calls, by the names of `reference.py`: Triton on CUDA when Triton imports,
else the torch reference. `ROOFTOP_KERNELS=reference|triton` forces one (read at each call).

Forcing `triton` on CPU tensors works only under `TRITON_INTERPRET=1` (tiny shapes, tests).
"""

import functools
import importlib
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


def _pick(t: torch.Tensor, module: str, name: str):
    """`module.name` (a Triton module of this package) when `t`'s kernels run in Triton, else `reference.name`."""
    if use_triton(t):
        return getattr(importlib.import_module(f"rooftop.engine.kernels.{module}"), name)
    return getattr(reference, name)


def _check_scale(weight_scale: float) -> float:
    if not weight_scale > 0:
        raise ValueError(f"indexer weight_scale must be positive, got {weight_scale}")
    return weight_scale


def indexer_topk_decode(q, weights, index_k_cache, block_tables, seq_lens, num_pages: int, topk: int,
                        ordered: bool = True, weight_scale: float = 1.0, slots: bool = False):
    """See `reference.indexer_topk_decode`, with head weights `weights * weight_scale` (a positive scale);
    the Triton version's time follows seq_lens, not num_pages.

    `ordered=False` lets the Triton version skip ordering the winners best first (they come in
    position order, -1 after them); the reference always orders them. A positive scale of every
    score changes no pick, so the Triton version leaves it out (one elementwise kernel fewer); the
    reference applies it, rounded to the weights' dtype. With `slots` (and `ordered=False`) the picks
    come as flat cache slots (`positions_to_slots` through each sequence's table; Triton writes them
    in its selection kernel).
    """
    _check_scale(weight_scale)
    if slots and ordered:
        raise ValueError("indexer_topk_decode: slots=True needs ordered=False")
    if use_triton(q):
        from rooftop.engine.kernels import triton_indexer

        return triton_indexer.indexer_topk_decode(q, weights, index_k_cache, block_tables, seq_lens, num_pages, topk,
                                                  ordered=ordered, slots=slots)
    if weight_scale != 1.0:
        weights = weights * weight_scale
    picks = reference.indexer_topk_decode(q, weights, index_k_cache, block_tables, seq_lens, num_pages, topk)
    if not slots:
        return picks
    rows = torch.arange(picks.shape[0], device=picks.device)
    return reference.positions_to_slots(picks, rows, block_tables, index_k_cache.shape[1])


def indexer_topk_prefill(q, weights, index_k_cache, block_tables, seq_lens, query_lens, positions, topk: int,
                         token_seq=None, num_pages: int | None = None, weight_scale: float = 1.0, slots: bool = False):
    """See `reference.indexer_topk_prefill` (`seq_lens` a list, or a tensor the reference reads back),
    with head weights `weights * weight_scale` and `slots` as in `indexer_topk_decode` (slots need
    `token_seq`).

    The Triton version (given `token_seq` [T] and the pages to score, `num_pages`) scores every token
    as a decode query of its own, with no per-sequence loop and no host sync; its picks come in
    position order (valid first), not best first."""
    _check_scale(weight_scale)
    if token_seq is not None and num_pages is not None and use_triton(q):
        from rooftop.engine.kernels import triton_indexer

        return triton_indexer.indexer_topk_prefill(q, weights, index_k_cache, block_tables, token_seq, positions,
                                                   num_pages, topk, slots=slots)
    if slots and token_seq is None:
        raise ValueError("indexer_topk_prefill: slots=True needs token_seq")
    if isinstance(seq_lens, torch.Tensor):
        seq_lens = seq_lens.tolist()
    if weight_scale != 1.0:
        weights = weights * weight_scale
    picks = reference.indexer_topk_prefill(q, weights, index_k_cache, block_tables, seq_lens, query_lens, positions,
                                           topk)
    if not slots:
        return picks
    return reference.positions_to_slots(picks, token_seq, block_tables, index_k_cache.shape[1])


def sparse_mla(q, kv_cache, slots, kv_lora_rank: int, scale: float, q_rope=None, valid_lens=None):
    """See `reference.sparse_mla`; Triton: split-K with a log-sum-exp combine, skipping slots past valid_lens."""
    return _pick(q, "triton_sparse_mla", "sparse_mla")(q, kv_cache, slots, kv_lora_rank, scale, q_rope=q_rope,
                                                       valid_lens=valid_lens)


def moe_experts(x, topk_ids, topk_weights, w13, w2, shared=None, residual=None, shared_w13=None, shared_w2=None,
                next_norm=None, layout=None):
    """See `reference.moe_experts`; Triton: a grouped GEMM with no host synchronisation (the shared
    expert, given by its weights, one more expert in it; the next norm in its last kernel), on the
    pairs' layout `route` made where it did."""
    kw = dict(shared=shared, residual=residual, shared_w13=shared_w13, shared_w2=shared_w2, next_norm=next_norm)
    if use_triton(x):
        from rooftop.engine.kernels import triton_moe

        return triton_moe.moe_experts(x, topk_ids, topk_weights, w13, w2, layout=layout, **kw)
    return reference.moe_experts(x, topk_ids, topk_weights, w13, w2, **kw)


def _skinny(t, rows: int) -> bool:
    """Whether a product of `rows` rows of t goes to `triton_matmul`: 16-bit CUDA tensors of up to
    _SKINNY_ROWS rows (fp32 stays in cuBLAS, whose fp32 GEMMs do not round to tf32). Forced `triton`
    on the CPU keeps torch here; the interpreter tests call `triton_matmul` directly."""
    return t.is_cuda and t.dtype in (torch.bfloat16, torch.float16) and rows <= _SKINNY_ROWS and use_triton(t)


def linear(x, weight):
    """See `reference.linear`; Triton (`triton_matmul`) for a decode step's few rows, whose time is the
    weight's read: on the H200 it took the graphed C=1 step from 2.04 to 1.90 ms (docs/perf/engine-serve-h200.md)."""
    if _skinny(x, x.numel() // max(1, x.shape[-1])):
        from rooftop.engine.kernels import triton_matmul

        return triton_matmul.linear(x, weight)
    return reference.linear(x, weight)


def bmm(a, b, out=None):
    """See `reference.bmm`; Triton for up to _SKINNY_ROWS rows a batch (the absorbed attention's per-head products)."""
    if _skinny(a, a.shape[1]):
        from rooftop.engine.kernels import triton_matmul

        return triton_matmul.bmm(a, b, out=out)
    return reference.bmm(a, b, out=out)


# triton_matmul.MAX_ROWS, without importing Triton where it is absent.
_SKINNY_ROWS = 16


def folds_shared_expert(x, top_k: int, num_experts: int) -> bool:
    """Whether `moe_experts` runs a shared expert for x inside the routed experts' kernels: the Triton
    path, 16-bit inputs (fp32 would round to tf32 in `tl.dot`, where cuBLAS does not), and pairs that
    fit its one-program layout kernel with the shared expert counted (else the torch layout's ~15 ops
    would cost more launches than the fold saves)."""
    if x.dtype not in (torch.bfloat16, torch.float16) or not use_triton(x):
        return False
    from rooftop.engine.kernels import triton_moe

    return triton_moe.fold_fits(x.shape[0], top_k, num_experts)


def silu_mul(gate, up):
    """See `reference.silu_mul`."""
    return _pick(gate, "triton_norm_rope", "silu_mul")(gate, up)


def route(x, gate_weight, top_k: int, scoring: str, norm_topk_prob: bool, scaling: float,
          layout_experts: int | None = None, shared: bool = False):
    """See `reference.route` -> (weights, ids, layout). Triton: logits, scores, top-k and
    renormalisation in one kernel, and with `layout_experts` (the experts `moe_experts` counts, the
    shared one included with `shared`) the pairs' layout for `moe_experts` too, where one program
    takes it; else (and in the reference) the layout is None and `moe_experts` makes it."""
    if use_triton(x):
        from rooftop.engine.kernels import triton_moe

        return triton_moe.route_and_layout(x, gate_weight, top_k, scoring, norm_topk_prob, scaling,
                                           layout_experts, shared)
    return (*reference.route(x, gate_weight, top_k, scoring, norm_topk_prob, scaling), None)


def positions_to_slots(positions, token_seq, block_tables, block_size: int):
    """See `reference.positions_to_slots`."""
    return _pick(positions, "triton_sparse_mla", "positions_to_slots")(positions, token_seq, block_tables, block_size)


def rms_norm(x, weight, eps: float):
    """See `reference.rms_norm`."""
    return _pick(x, "triton_norm_rope", "rms_norm")(x, weight, eps)


def step_inputs(input_ids, positions, cu_query_lens, embedding, norm_weight, eps: float, inv_freq, top_k: int):
    """See `reference.step_inputs`: the embedding rows, the first norm, RoPE's cos and sin, the tokens'
    sequences and valid pick counts; Triton: one kernel (the torch reference takes ~15)."""
    return _pick(embedding, "triton_norm_rope", "step_inputs")(input_ids, positions, cu_query_lens, embedding,
                                                              norm_weight, eps, inv_freq, top_k)


def add_rms_norm(x, residual, weight, eps: float):
    """See `reference.add_rms_norm`: (rms_norm(residual + x), residual + x) in one kernel."""
    return _pick(x, "triton_norm_rope", "add_rms_norm")(x, residual, weight, eps)


def rope2(x, y, cos, sin):
    """See `reference.rope2`: (rope(x), rope(y)) in one kernel."""
    return _pick(x, "triton_norm_rope", "rope2")(x, y, cos, sin)


def absorb_rope2(q_nope, w_uk, x, y, cos, sin):
    """See `reference.absorb_rope2`. One 16-bit token on the Triton path: one kernel, the per-head
    products beside both rotations (ABSORB_ROPE_ONE_LAUNCH); else `bmm` and `rope2`, each as dispatched."""
    if ABSORB_ROPE_ONE_LAUNCH and q_nope.shape[0] == 1 and _skinny(q_nope, 1) and w_uk.stride(-1) == 1:
        from rooftop.engine.kernels import triton_norm_rope

        return triton_norm_rope.absorb_rope2(q_nope, w_uk, x, y, cos, sin)
    return bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1), *rope2(x, y, cos, sin)


# Benchmarks compare with the two launches.
ABSORB_ROPE_ONE_LAUNCH = True


def norm_rope_store2(first, second, cos, sin, slot_mapping, norm=None):
    """See `reference.norm_rope_store2`: two cached rows of each token (`reference.CachedRows`), and the
    rms_norm of `norm` (`reference.NormRows`) where given, in one kernel."""
    return _pick(first.rows, "triton_norm_rope", "norm_rope_store2")(first, second, cos, sin, slot_mapping, norm)
