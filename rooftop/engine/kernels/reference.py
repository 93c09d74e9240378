"""Torch reference kernels: one function per kernel the model calls; Triton versions match these.

Shapes: T = new tokens, B = sequences, H = heads, D = head dim, K = top-k, N = cache blocks,
S = block size, P = block-table columns, E = experts.
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F

# Bound the [queries, heads, keys] score tensor of the prefill indexer (elements), so a long
# context does not allocate gigabytes at once.
PREFILL_SCORE_ELEMENTS = 1 << 26
# Bound the gathered [tokens, K, C] rows of sparse attention in prefill (elements).
SPARSE_GATHER_ELEMENTS = 1 << 26


def _pad_topk(values: torch.Tensor, indices: torch.Tensor, topk: int) -> torch.Tensor:
    """Mark -inf picks invalid (-1) and pad to `topk` columns with -1."""
    indices = indices.masked_fill(values == float("-inf"), -1)
    if indices.shape[-1] < topk:
        indices = F.pad(indices, (0, topk - indices.shape[-1]), value=-1)
    return indices


def indexer_topk_decode(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_k_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    num_pages: int,
    topk: int,
) -> torch.Tensor:
    """Lightning-indexer top-k for one decode query per sequence, over `num_pages` block-table columns.

    q [B, H, D], weights [B, H], index_k_cache [N, S, D], block_tables [B, >=P] (-1 padding),
    seq_lens [B] (the query is the last token, so every position < seq_len is visible)
    -> LongTensor[B, topk]: token positions, best first, -1 where fewer than topk exist.

    The work is fixed by `num_pages`: the capacity bound passes ceil(context_length / S), the
    actual bound ceil(max(seq_lens) / S). Keys of invalid blocks are read from block 0, then masked.
    """
    batch, _, dim = q.shape
    block_size = index_k_cache.shape[1]
    pages = block_tables[:, :num_pages].long()
    if pages.shape[1] < num_pages:
        pages = F.pad(pages, (0, num_pages - pages.shape[1]), value=-1)
    keys = index_k_cache[pages.clamp(min=0)].view(batch, num_pages * block_size, dim)  # [B, P*S, D]
    scores = torch.bmm(keys, q.transpose(1, 2))  # [B, P*S, H]
    # Weighting and the head sum in float32, so bf16 rounding does not reorder near-equal keys.
    scores = (scores.relu() * weights.float()[:, None, :]).sum(-1)  # [B, P*S]
    key_pos = torch.arange(num_pages * block_size, device=q.device)
    scores.masked_fill_(key_pos[None, :] >= seq_lens[:, None].long(), float("-inf"))
    values, indices = scores.topk(min(topk, scores.shape[1]), dim=-1)
    return _pad_topk(values, indices, topk)


def indexer_topk_prefill(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_k_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: list[int],
    query_lens: list[int],
    positions: torch.Tensor,
    topk: int,
) -> torch.Tensor:
    """Lightning-indexer top-k for prefill chunks, scoring each sequence's actual length, causally.

    q [T, H, D], weights [T, H], index_k_cache [N, S, D], block_tables [B, P], seq_lens and
    query_lens: per sequence (new tokens are the last query_len of seq_len), positions [T]
    -> LongTensor[T, topk]: token positions, best first, -1 where fewer than topk are visible.
    """
    num_tokens, heads, dim = q.shape
    block_size = index_k_cache.shape[1]
    out = torch.full((num_tokens, topk), -1, dtype=torch.long, device=q.device)
    start = 0
    for b, (seq_len, q_len) in enumerate(zip(seq_lens, query_lens, strict=True)):
        pages = block_tables[b, : (seq_len + block_size - 1) // block_size].long()
        keys = index_k_cache[pages].view(-1, dim)[:seq_len]  # [L, D]
        key_pos = torch.arange(seq_len, device=q.device)
        step = max(1, PREFILL_SCORE_ELEMENTS // (heads * seq_len))
        for t0 in range(start, start + q_len, step):
            t1 = min(t0 + step, start + q_len)
            scores = torch.matmul(q[t0:t1], keys.T)  # [t, H, L]
            scores = (scores.relu() * weights[t0:t1, :, None].float()).sum(1)  # [t, L]
            scores.masked_fill_(key_pos[None, :] > positions[t0:t1, None], float("-inf"))
            values, indices = scores.topk(min(topk, seq_len), dim=-1)
            out[t0:t1] = _pad_topk(values, indices, topk)
        start += q_len
    return out


def sparse_mla(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    slots: torch.Tensor,
    kv_lora_rank: int,
    scale: float,
    q_rope: torch.Tensor | None = None,
    valid_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sparse MLA in absorbed form: each query attends to its top-k latent rows of the paged cache.

    q [T, H, C] (C = kv_lora_rank + rope dim: q_nope absorbed by W_UK, then q_rope),
    kv_cache [N, S, C], slots [T, K] (flat block*S+offset, -1 invalid; each row has >= 1 valid)
    -> [T, H, kv_lora_rank]: softmax(q . row * scale) weighted sum of the rows' latent part.

    With `q_rope` [T, H, C - kv_lora_rank], q holds only the absorbed part [T, H, kv_lora_rank].
    `valid_lens` [T] says that slots at or past it are all -1 (the Triton kernel skips them; here
    they are masked anyway, so it changes nothing).
    """
    if q_rope is not None:
        q = torch.cat([q, q_rope], dim=-1)
    num_tokens, heads, width = q.shape
    rows_all = kv_cache.view(-1, width)
    out = q.new_empty(num_tokens, heads, kv_lora_rank)
    step = max(1, SPARSE_GATHER_ELEMENTS // (slots.shape[1] * width))
    for t0 in range(0, num_tokens, step):
        t1 = min(t0 + step, num_tokens)
        idx = slots[t0:t1]
        rows = rows_all[idx.clamp(min=0)]  # [t, K, C]
        scores = torch.bmm(q[t0:t1], rows.transpose(1, 2)).float() * scale  # [t, H, K]
        scores.masked_fill_((idx < 0)[:, None, :], float("-inf"))
        probs = scores.softmax(-1).to(q.dtype)
        out[t0:t1] = torch.bmm(probs, rows[..., :kv_lora_rank])
    return out


def moe_experts(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    shared: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    shared_w13: torch.Tensor | None = None,
    shared_w2: torch.Tensor | None = None,
    next_norm: tuple[torch.Tensor, float] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Routed SwiGLU experts: sum over each token's chosen experts of weight * expert(x).

    x [T, Hd], topk_ids [T, k], topk_weights [T, k], w13 [E, 2I, Hd] (gate rows then up rows),
    w2 [E, Hd, I] -> [T, Hd]; then `+ shared` (the shared expert's output) and `residual +` that,
    each rounded to x's dtype, where given. `shared_w13` [2I', Hd] and `shared_w2` [Hd, I'] give the
    shared expert's weights instead of its output. With `next_norm` (weight, eps):
    -> (out, rms_norm(out, weight, eps)), the next layer's input norm.
    """
    if shared_w13 is not None:
        if shared is not None or shared_w2 is None:
            raise ValueError("moe_experts: shared_w13 needs shared_w2, and no `shared` output")
        gate, up = F.linear(x, shared_w13).chunk(2, dim=-1)
        shared = F.linear(silu_mul(gate, up), shared_w2)
    out = _routed(x, topk_ids, topk_weights, w13, w2)
    if shared is not None:
        out = out + shared
    if residual is not None:
        out = residual + out
    return out if next_norm is None else (out, rms_norm(out, *next_norm))


def _routed(x, topk_ids, topk_weights, w13, w2) -> torch.Tensor:
    num_tokens, top = topk_ids.shape
    flat_ids = topk_ids.reshape(-1)
    order = flat_ids.argsort(stable=True)
    token_of = order // top
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()  # host sync: reference only
    out = torch.zeros_like(x)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        tokens = token_of[start : start + count]
        gate, up = (x[tokens] @ w13[expert].T).chunk(2, dim=-1)
        y = (F.silu(gate) * up) @ w2[expert].T
        y = y * topk_weights.reshape(-1)[order[start : start + count], None].to(y.dtype)
        out.index_add_(0, tokens, y)
        start += count
    return out


def positions_to_slots(
    positions: torch.Tensor, token_seq: torch.Tensor, block_tables: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Map token positions [T, K] (-1 = none) of each token's sequence to flat cache slots (-1 kept)."""
    pos = positions.clamp(min=0)
    blocks = block_tables.long()[token_seq[:, None], pos // block_size]
    return torch.where(positions >= 0, blocks * block_size + pos % block_size, -1)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T (no bias)."""
    return F.linear(x, weight)


def bmm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """a [B, M, K] @ b [B, K, N] -> [B, M, N], new or written into `out` (which may be a strided view:
    cuBLAS writes a [B, M, N] view of a [M, B, N] buffer in place)."""
    if out is None:
        return torch.bmm(a, b)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):  # out= takes no autograd
        return out.copy_(torch.bmm(a, b))
    return torch.bmm(a, b, out=out)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up: the SwiGLU activation."""
    return F.silu(gate) * up


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) * weight over the last dim, in float32, returned in x's dtype."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * weight.float()).to(x.dtype)


class StepInputs(NamedTuple):
    """What a step derives from its batch before the first layer (`step_inputs`)."""

    x: torch.Tensor  # [T, hidden] the tokens' embedding rows (the residual stream)
    h: torch.Tensor  # [T, hidden] rms_norm(x): the first layer's attention input
    cos: torch.Tensor  # float32 [T, rope_dim / 2]
    sin: torch.Tensor
    token_seq: torch.Tensor  # long [T]: each token's sequence index
    valid_lens: torch.Tensor  # int32 [T]: min(position + 1, top-k)


def step_inputs(input_ids: torch.Tensor, positions: torch.Tensor, cu_query_lens: torch.Tensor,
                embedding: torch.Tensor, norm_weight: torch.Tensor, eps: float, inv_freq: torch.Tensor,
                top_k: int) -> StepInputs:
    """A step's per-token inputs from its ids, positions and cu_query_lens [B + 1]: embedding rows, their
    rms_norm with norm_weight, the RoPE angles positions x inv_freq as cos and sin, the tokens'
    sequence indices, and how many of the indexer's picks can be valid."""
    x = embedding[input_ids]
    angles = positions.float()[:, None] * inv_freq[None, :]
    query_lens = torch.diff(cu_query_lens).long()
    seqs = torch.arange(len(query_lens), device=x.device)
    token_seq = torch.repeat_interleave(seqs, query_lens, output_size=x.shape[0])
    return StepInputs(x, rms_norm(x, norm_weight, eps), angles.cos(), angles.sin(), token_seq,
                      (positions + 1).clamp(max=top_k).int())


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(residual + x), residual + x): a residual add and the next norm."""
    summed = residual + x
    return rms_norm(summed, weight, eps), summed


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first 2 * cos.shape[-1] dims of x [T, D] or [T, H, D] by per-token angles (half-split
    form; cos, sin float32 [T, R/2]); the other dims are copied. A new tensor in x's dtype."""
    rot = 2 * cos.shape[-1]
    if x.dim() == 3:
        cos, sin = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., :rot].float().chunk(2, dim=-1)
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
    return rotated if rot == x.shape[-1] else torch.cat([rotated, x[..., rot:]], dim=-1)


def rope2(x: torch.Tensor, y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rope(x), rope(y)): two tensors of the same tokens (attention's and the indexer's queries)."""
    return rope(x, cos, sin), rope(y, cos, sin)


def absorb_rope2(q_nope: torch.Tensor, w_uk: torch.Tensor, x: torch.Tensor, y: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the absorbed query q_nope [T, H, nope] @ w_uk [H, nope, C] per head -> [T, H, C], rope(x), rope(y)):
    what attention computes from its queries before the indexer picks."""
    return bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1), *rope2(x, y, cos, sin)


def norm_rope_store(
    rows: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    norm_dim: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rope_start: int,
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write each new token's cached row: rms_norm over rows[:, :norm_dim] (the rest kept), then RoPE
    on the 2 * cos.shape[-1] dims from `rope_start`; into cache [N, S, D] at flat `slot_mapping` [T].

    MLA's latent row is (norm over the latent, RoPE on the trailing key part); the indexer's key is
    (norm over all of it, RoPE on its first dims).
    """
    width = rows.shape[-1]
    normed = rms_norm(rows[:, :norm_dim], weight, eps)
    row = normed if norm_dim == width else torch.cat([normed, rows[:, norm_dim:]], dim=-1)
    rot = 2 * cos.shape[-1]
    if rot:
        row = torch.cat([row[:, :rope_start], rope(row[:, rope_start:rope_start + rot], cos, sin),
                         row[:, rope_start + rot:]], dim=-1)
    cache.view(-1, width)[slot_mapping] = row.to(cache.dtype)


class CachedRows(NamedTuple):
    """One `norm_rope_store` write, less the tokens' shared cos, sin and slots."""

    rows: torch.Tensor
    weight: torch.Tensor
    eps: float
    norm_dim: int
    rope_start: int
    cache: torch.Tensor


class NormRows(NamedTuple):
    """An `rms_norm` of x riding along with a `norm_rope_store2` of the same tokens."""

    x: torch.Tensor
    weight: torch.Tensor
    eps: float


def norm_rope_store2(
    first: CachedRows, second: CachedRows, cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor,
    norm: NormRows | None = None,
) -> torch.Tensor | None:
    """Two `norm_rope_store` writes of the same tokens (MLA's latent row and the indexer's key); with
    `norm`, also rms_norm(norm.x) (the q latent's norm), returned."""
    for w in (first, second):
        norm_rope_store(w.rows, w.weight, w.eps, w.norm_dim, cos, sin, w.rope_start, w.cache, slot_mapping)
    return None if norm is None else rms_norm(norm.x, norm.weight, norm.eps)


def route(
    x: torch.Tensor, gate_weight: torch.Tensor, top_k: int, scoring: str, norm_topk_prob: bool, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """MoE router: gate logits in float32, sigmoid or softmax, top-k, optional renormalisation, scaling.

    x [T, hidden], gate_weight [E, hidden] -> (weights float32 [T, k], expert ids int64 [T, k]).
    """
    logits = F.linear(x.float(), gate_weight.float())
    scores = logits.sigmoid() if scoring == "sigmoid" else logits.softmax(-1)
    weights, ids = scores.topk(top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights * scaling, ids
