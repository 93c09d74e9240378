"""The Triton kernels against their torch references in float64, CUDA graphs, and greedy tokens.

Skipped without CUDA. Outputs are poisoned: before each kernel call the caching allocator
is handed NaN-filled memory, so a kernel that leaves part of its output unwritten shows NaN.
"""

import math
import random

import pytest
import torch

from rooftop.engine.kernels import (
    dispatch,
    reference,
    triton_indexer,
    triton_matmul,
    triton_moe,
    triton_norm_rope,
    triton_sparse_mla,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

DEV = "cuda"


def poison_allocator(mib: int = 512) -> None:
    """Fill free cached memory with NaN, so tensors allocated next start as NaN."""
    big = torch.full((mib * (1 << 20) // 4,), float("nan"), device=DEV)
    # Tensors under 1 MiB come from the allocator's small pool: poison that too.
    small = [torch.full(((1 << 20) // 8,), float("nan"), device=DEV) for _ in range(64)]
    del big, small


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEV).manual_seed(seed)


# ---- sparse MLA ----

SPARSE_CASES = [  # tokens, heads, rank, rope, topk, cache tokens, config override
    (1, 16, 512, 64, 512, 4096, None),
    (4, 32, 512, 64, 2048, 1 << 16, None),
    (33, 128, 512, 64, 2048, 1 << 16, None),
    (7, 4, 64, 16, 64, 1024, None),
    (5, 20, 128, 32, 300, 2048, {"BLOCK_H": 16, "BLOCK_N": 32, "splits": 5, "num_warps": 4, "num_stages": 2}),
    (64, 32, 512, 64, 2048, 1 << 16, {"BLOCK_H": 32, "BLOCK_N": 32, "splits": 1, "num_warps": 8, "num_stages": 2}),
    (3, 40, 512, 64, 700, 4096,
     {"BLOCK_H": 32, "BLOCK_N": 64, "splits": 3, "num_warps": 8, "num_stages": 2, "rows_as_m": True}),
    # Slots carried a tile ahead (the row loads pipelined num_stages - 1 deep), both layouts.
    (9, 16, 512, 64, 1000, 1 << 15,
     {"BLOCK_H": 16, "BLOCK_N": 16, "splits": 3, "num_warps": 2, "num_stages": 4, "prefetch": True}),
    (6, 64, 512, 64, 900, 4096,
     {"BLOCK_H": 64, "BLOCK_N": 64, "splits": 2, "num_warps": 8, "num_stages": 2, "rows_as_m": True, "prefetch": True}),
]


@pytest.mark.parametrize("case", SPARSE_CASES)
def test_sparse_mla_matches_float64_reference(case):
    tokens, heads, rank, rope, topk, cache_tokens, cfg = case
    g = _gen(tokens * 1000 + heads)
    width = rank + rope
    block = 64
    q = torch.randn(tokens, heads, width, generator=g, device=DEV).bfloat16()
    kv = torch.randn(cache_tokens // block, block, width, generator=g, device=DEV).bfloat16()
    slots = torch.randint(0, cache_tokens, (tokens, topk), generator=g, device=DEV)
    slots = slots.masked_fill(torch.rand(tokens, topk, generator=g, device=DEV) < 0.2, -1)
    slots[:, 0] = slots[:, 0].abs()  # each row keeps >= 1 valid
    slots[0, 1:] = -1  # a sequence of length 1: one valid row, the rest invalid
    if tokens > 2:
        slots[2, : topk // 2] = -1  # a whole first half invalid (whole splits empty)
    scale = (128 + rope) ** -0.5
    ref = reference.sparse_mla(q.double(), kv.double(), slots, rank, scale)
    poison_allocator()
    out = triton_sparse_mla.sparse_mla(q, kv, slots, rank, scale, cfg)
    assert out.shape == (tokens, heads, rank) and out.dtype == torch.bfloat16
    assert not out.isnan().any()
    err = (out.double() - ref).abs().max().item()
    assert err < 2e-2, err
    # Row 0 attends to one row only: its output is exactly that row's latent part (bf16-rounded).
    torch.testing.assert_close(out[0].double(), kv.view(-1, width)[slots[0, 0], :rank].double().expand(heads, rank),
                               atol=1e-2, rtol=1e-2)


def test_sparse_mla_strided_query_separate_rope_and_valid_lens():
    """The engine's call: the absorbed query as a transposed bmm output, RoPE part apart, and each
    token's valid slots a prefix of its top-k (the kernel reads no further)."""
    g = _gen(77)
    tokens, heads, rank, rope, topk, block = 48, 32, 512, 64, 2048, 64
    q_abs = torch.randn(heads, tokens, rank, generator=g, device=DEV).bfloat16().transpose(0, 1)
    q_rope = torch.randn(tokens, heads, rope, generator=g, device=DEV).bfloat16()
    kv = torch.randn((1 << 16) // block, block, rank + rope, generator=g, device=DEV).bfloat16()
    lens = torch.randint(1, topk + 1, (tokens,), generator=g, device=DEV)
    lens[0], lens[1] = 1, topk
    slots = torch.randint(0, 1 << 16, (tokens, topk), generator=g, device=DEV)
    slots = slots.masked_fill(torch.arange(topk, device=DEV)[None, :] >= lens[:, None], -1)
    scale = (128 + rope) ** -0.5
    ref = reference.sparse_mla(q_abs.double(), kv.double(), slots, rank, scale, q_rope=q_rope.double())
    poison_allocator()
    out = triton_sparse_mla.sparse_mla(q_abs, kv, slots, rank, scale, q_rope=q_rope, valid_lens=lens.int())
    assert not out.isnan().any()
    assert (out.double() - ref).abs().max().item() < 2e-2


# ---- the model's glue: norms, RoPE, cache rows, slots, router, MoE layout ----

def test_norms_and_rope_match_float64():
    g = _gen(5)
    for tokens, dim in ((1, 768), (64, 2048), (33, 512)):
        x = torch.randn(tokens, dim, generator=g, device=DEV).bfloat16()
        res = torch.randn(tokens, dim, generator=g, device=DEV).bfloat16()
        w = (torch.rand(dim, generator=g, device=DEV) + 0.5).bfloat16()
        ref = reference.rms_norm(x.double(), w.double(), 1e-6)
        poison_allocator()
        out = triton_norm_rope.rms_norm(x, w, 1e-6)
        assert (out.double() - ref).abs().max().item() < 3e-2
        normed, summed = triton_norm_rope.add_rms_norm(x, res, w, 1e-6)
        assert torch.equal(summed, res + x)  # the same bf16 rounding as torch's add
        assert (normed.double() - reference.rms_norm(summed.double(), w.double(), 1e-6)).abs().max().item() < 3e-2
    for tokens, heads, dim, rot in ((64, 32, 192, 64), (5, 32, 128, 64), (3, 1, 64, 64)):
        full = torch.randn(tokens, heads, dim + 128, generator=g, device=DEV).bfloat16()
        x = full[..., 128:]  # strided, as q[..., nope:] is
        ang = torch.rand(tokens, rot // 2, generator=g, device=DEV) * 6.3
        poison_allocator()
        out = triton_norm_rope.rope(x, ang.cos(), ang.sin())
        ref = reference.rope(x.double(), ang.cos().double(), ang.sin().double())
        assert not out.isnan().any() and (out.double() - ref).abs().max().item() < 3e-2
    # Attention's and the indexer's queries in one launch, as the model rotates them.
    q = torch.randn(64, 32, 192, generator=g, device=DEV).bfloat16()[..., 128:]
    iq = torch.randn(64, 32, 128, generator=g, device=DEV).bfloat16()
    ang = torch.rand(64, 32, generator=g, device=DEV) * 6.3
    poison_allocator()
    got = triton_norm_rope.rope2(q, iq, ang.cos(), ang.sin())
    for out, x in zip(got, (q, iq), strict=True):
        ref = reference.rope(x.double(), ang.cos().double(), ang.sin().double())
        assert not out.isnan().any() and (out.double() - ref).abs().max().item() < 3e-2


def test_silu_mul_matches_torch():
    g = _gen(3)
    gu = torch.randn(64, 2 * 5632, generator=g, device=DEV).bfloat16()
    gate, up = gu.split(5632, dim=-1)  # strided halves, as the stacked gate/up GEMM gives them
    poison_allocator()
    out = triton_norm_rope.silu_mul(gate, up)
    ref = reference.silu_mul(gate.double(), up.double())
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)  # bf16 rounding, twice


@pytest.mark.parametrize("width,norm_dim,rope_start", [(576, 512, 512), (128, 128, 0)])
def test_norm_rope_store_matches_reference(width, norm_dim, rope_start):
    g = _gen(width)
    tokens, block = 64, 64
    rows = torch.randn(tokens, width, generator=g, device=DEV).bfloat16()
    w = (torch.rand(norm_dim, generator=g, device=DEV) + 0.5).bfloat16()
    ang = torch.rand(tokens, 32, generator=g, device=DEV) * 6.3
    slots = torch.randperm(16 * block, generator=g, device=DEV)[:tokens]
    caches = [torch.zeros(16, block, width, dtype=torch.bfloat16, device=DEV) for _ in range(2)]
    reference.norm_rope_store(rows, w, 1e-6, norm_dim, ang.cos(), ang.sin(), rope_start, caches[0], slots)
    triton_norm_rope.norm_rope_store(rows, w, 1e-6, norm_dim, ang.cos(), ang.sin(), rope_start, caches[1], slots)
    diff = (caches[0].float() - caches[1].float()).abs()
    assert diff.max().item() < 3e-2  # one bf16 ulp at most, from the reduction order
    assert int((caches[1].view(-1, width).abs().sum(-1) > 0).sum()) == tokens  # only those rows written


def test_norm_rope_store2_writes_both_rows_as_two_calls_do():
    g = _gen(11)
    tokens, block = 64, 64
    ang = torch.rand(tokens, 32, generator=g, device=DEV) * 6.3
    slots = torch.randperm(16 * block, generator=g, device=DEV)[:tokens]
    writes = []
    for width, norm_dim, rope_start in ((576, 512, 512), (128, 128, 0)):
        rows = torch.randn(tokens, width, generator=g, device=DEV).bfloat16()
        w = (torch.rand(norm_dim, generator=g, device=DEV) + 0.5).bfloat16()
        caches = [torch.zeros(16, block, width, dtype=torch.bfloat16, device=DEV) for _ in range(2)]
        writes.append([reference.CachedRows(rows, w, 1e-6, norm_dim, rope_start, c) for c in caches])
    reference.norm_rope_store2(writes[0][0], writes[1][0], ang.cos(), ang.sin(), slots)
    triton_norm_rope.norm_rope_store2(writes[0][1], writes[1][1], ang.cos(), ang.sin(), slots)
    for want, got in writes:
        assert (want.cache.float() - got.cache.float()).abs().max().item() < 3e-2
        assert int((got.cache.view(-1, got.cache.shape[-1]).abs().sum(-1) > 0).sum()) == tokens


def test_step_inputs_match_torch():
    """Embedding rows, the first norm, RoPE angles, sequences and valid counts of a mixed step."""
    g = _gen(11)
    cu = torch.tensor([0, 1, 2, 514, 515], dtype=torch.int32, device=DEV)
    ids = torch.randint(0, 512, (515,), generator=g, device=DEV)
    pos = torch.randint(0, 131072, (515,), generator=g, device=DEV)
    emb = torch.randn(512, 2048, generator=g, device=DEV).bfloat16()
    nw = (torch.rand(2048, generator=g, device=DEV) + 0.5).bfloat16()
    freq = 1.0 / 10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32, device=DEV) / 64)
    got = triton_norm_rope.step_inputs(ids, pos, cu, emb, nw, 1e-6, freq, 2048)
    want = reference.step_inputs(ids, pos, cu, emb, nw, 1e-6, freq, 2048)
    for name, a, b in zip(want._fields, got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        if name in ("x", "token_seq", "valid_lens"):
            assert torch.equal(a, b), name
        else:
            assert (a.float() - b.float()).abs().max().item() < (2e-2 if name == "h" else 1e-3), name


def test_positions_to_slots_router_and_layout_match_torch():
    g = _gen(9)
    tables = torch.randint(0, 500, (8, 40), generator=g, device=DEV, dtype=torch.int32)
    pos = torch.randint(-1, 40 * 64, (16, 2048), generator=g, device=DEV)
    seq = torch.randint(0, 8, (16,), generator=g, device=DEV)
    want = reference.positions_to_slots(pos, seq, tables, 64)
    poison_allocator()
    assert torch.equal(triton_sparse_mla.positions_to_slots(pos, seq, tables, 64), want)

    x = torch.randn(64, 2048, generator=g, device=DEV).bfloat16()
    gate = (torch.randn(32, 2048, generator=g, device=DEV) * 2048**-0.5).bfloat16()
    for scoring in ("sigmoid", "softmax"):
        w_ref, ids_ref = reference.route(x.double(), gate.double(), 4, scoring, True, 2.5)
        poison_allocator()
        w, ids = triton_moe.route(x, gate, 4, scoring, True, 2.5)
        agree = (ids == ids_ref).all(-1)
        assert int(agree.sum()) >= 62, int(agree.sum())  # a near-tie may swap one token's experts
        assert (w[agree].double() - w_ref[agree]).abs().max().item() < 1e-4

    for tokens, experts, top_k in ((1, 32, 4), (64, 32, 4), (7, 8, 2)):
        ids = torch.rand(tokens, experts, generator=g, device=DEV).argsort(-1)[:, :top_k]
        poison_allocator()
        by_kernel = triton_moe.align_pairs(ids, experts, 16)
        old = triton_moe.ALIGN_KERNEL_ELEMENTS
        triton_moe.ALIGN_KERNEL_ELEMENTS = 0
        try:
            by_torch = triton_moe.align_pairs(ids, experts, 16)
        finally:
            triton_moe.ALIGN_KERNEL_ELEMENTS = old
        assert all(torch.equal(a, b) for a, b in zip(by_kernel, by_torch, strict=True))


# ---- indexer ----

def _indexer_inputs(seed, batch, heads, dim, lens, capacity_pages, block=64, positive_weights=False):
    g = _gen(seed)
    need = [math.ceil(n / block) for n in lens]
    num_blocks = sum(need) + 1
    q = torch.randn(batch, heads, dim, generator=g, device=DEV).bfloat16()
    w = torch.randn(batch, heads, generator=g, device=DEV)
    if positive_weights:
        w = w.abs()
    w = w.bfloat16()
    kc = torch.randn(num_blocks, block, dim, generator=g, device=DEV).bfloat16()
    tables = torch.full((batch, capacity_pages), -1, dtype=torch.int32, device=DEV)
    perm = torch.randperm(num_blocks - 1, generator=g, device=DEV) + 1
    used = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[used : used + n].int()
        used += n
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    return q, w, kc, tables, seq_lens


def _scores64(q, w, kc, tables, num_pages):
    batch, _, dim = q.shape
    keys = kc.double()[tables[:, :num_pages].long().clamp(min=0)].view(batch, -1, dim)
    return (torch.einsum("bhd,bkd->bkh", q.double(), keys).relu() * w.double()[:, None, :]).sum(-1)


INDEXER_CASES = [  # batch, heads, dim, lens, capacity pages, topk, positive weights (ties at 0)
    (4, 32, 128, [1, 100, 2048, 5000], 128, 2048, False),
    (3, 64, 128, [512, 513, 9000], 4097, 2048, False),
    (2, 4, 32, [700, 64], 16, 680, True),  # the 680th score is 0: a tie cut
    (8, 16, 64, [512] * 8, 4097, 512, False),
]


@pytest.mark.parametrize("case", INDEXER_CASES)
def test_indexer_picks_the_float64_topk(case):
    batch, heads, dim, lens, pages, topk, positive = case
    q, w, kc, tables, seq_lens = _indexer_inputs(len(lens) * 7 + heads, batch, heads, dim, lens, pages,
                                                 positive_weights=positive)
    ref = reference.indexer_topk_decode(q.double(), w.double(), kc.double(), tables, seq_lens, pages, topk)
    poison_allocator()
    out = triton_indexer.indexer_topk_decode(q, w, kc, tables, seq_lens, pages, topk)
    assert out.shape == (batch, topk) and out.dtype == torch.long
    scores = _scores64(q, w, kc, tables, pages)
    for b, n in enumerate(lens):
        got, want = out[b], ref[b]
        assert int((got >= 0).sum()) == min(n, topk)
        assert bool((got[min(n, topk):] == -1).all())
        picked = got[got >= 0]
        assert len(set(picked.tolist())) == len(picked)
        assert int(picked.max()) < n
        # Same scores rank by rank (positions may differ only among near-equal scores).
        got_s, want_s = scores[b, picked], scores[b, want[want >= 0]]
        torch.testing.assert_close(got_s, want_s, atol=2e-2 * want_s.abs().max().item() + 1e-3, rtol=0)
        assert bool((got_s[:-1] >= got_s[1:] - 2e-2 * got_s.abs().max()).all())  # best first
    unordered = triton_indexer.indexer_topk_decode(q, w, kc, tables, seq_lens, pages, topk, ordered=False)
    assert torch.equal(unordered.sort(1).values, out.sort(1).values)  # the same picks, valid ones first
    for b, n in enumerate(lens):
        assert bool((unordered[b, : min(n, topk)] >= 0).all()) and bool((unordered[b, min(n, topk):] == -1).all())
    # Written as cache slots by the selection kernel: the unordered picks through positions_to_slots.
    as_slots = triton_indexer.indexer_topk_decode(q, w, kc, tables, seq_lens, pages, topk, ordered=False, slots=True)
    rows = torch.arange(batch, device=DEV)
    assert torch.equal(as_slots, reference.positions_to_slots(unordered, rows, tables, kc.shape[1]))


PREFILL_INDEXER_CASES = [  # (cached, new) per sequence, heads, dim, topk
    ([(0, 512)], 64, 128, 2048),
    ([(3000, 512)], 64, 128, 2048),  # past the top-k: a real selection for every token
    ([(0, 100), (1500, 37), (2047, 300)], 32, 128, 2048),  # ragged, one crossing the top-k mid-chunk
]


@pytest.mark.parametrize("case", PREFILL_INDEXER_CASES)
def test_prefill_indexer_picks_the_float64_topk_causally(case):
    seqs, heads, dim, topk = case
    lens = [c + n for c, n in seqs]
    pages = max(math.ceil(n / 64) for n in lens)
    _, _, kc, tables, _ = _indexer_inputs(len(seqs) * 11 + heads, len(seqs), heads, dim, lens, pages)
    g = _gen(5)
    num_tokens = sum(n for _, n in seqs)
    q = torch.randn(num_tokens, heads, dim, generator=g, device=DEV).bfloat16()
    w = torch.randn(num_tokens, heads, generator=g, device=DEV).bfloat16()
    positions = torch.cat([torch.arange(c, c + n, device=DEV) for c, n in seqs])
    token_seq = torch.cat([torch.full((n,), b, device=DEV) for b, (_, n) in enumerate(seqs)])
    ref = reference.indexer_topk_prefill(q.double(), w.double(), kc.double(), tables, lens, [n for _, n in seqs],
                                         positions, topk)
    poison_allocator()
    out = triton_indexer.indexer_topk_prefill(q, w, kc, tables, token_seq, positions, pages, topk)
    assert out.shape == (num_tokens, topk) and out.dtype == torch.long
    keys = kc.double()[tables.long().clamp(min=0)].view(len(seqs), -1, dim)
    for t in range(0, num_tokens, 17):  # every 17th token: the float64 scores of its own sequence
        b, p = int(token_seq[t]), int(positions[t])
        n = min(p + 1, topk)
        got, want = out[t], ref[t]
        assert bool((got[:n] >= 0).all()) and bool((got[n:] == -1).all())
        assert int(got.max()) <= p and len(set(got[:n].tolist())) == n  # causal, no repeats
        scores = (torch.einsum("hd,kd->kh", q[t].double(), keys[b, : p + 1]).relu() * w[t].double()).sum(-1)
        got_s = scores[got[:n]].sort(descending=True).values
        want_s = scores[want[:n]].sort(descending=True).values
        torch.testing.assert_close(got_s, want_s, atol=2e-2 * want_s.abs().max().item() + 1e-3, rtol=0)


# ---- MoE ----

MOE_CASES = [  # tokens, hidden, intermediate, experts, top-k, pairs ranked by sort instead of one-hot
    (1, 256, 128, 8, 2, False), (7, 512, 256, 32, 4, False), (64, 2048, 512, 32, 4, False),
    (300, 256, 96, 16, 6, False), (300, 256, 96, 16, 6, True),
]


@pytest.mark.parametrize("case", MOE_CASES)
def test_moe_matches_float64_reference(case, monkeypatch):
    tokens, hidden, inter, experts, top_k, by_sort = case
    if by_sort:
        monkeypatch.setattr(triton_moe, "ONE_HOT_ELEMENTS", 0)
    g = _gen(tokens + experts)
    x = torch.randn(tokens, hidden, generator=g, device=DEV).bfloat16()
    ids = torch.rand(tokens, experts, generator=g, device=DEV).argsort(-1)[:, :top_k]
    weights = torch.rand(tokens, top_k, generator=g, device=DEV)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g, device=DEV) * hidden**-0.5).bfloat16()
    w2 = (torch.randn(experts, hidden, inter, generator=g, device=DEV) * inter**-0.5).bfloat16()
    ref = reference.moe_experts(x.double(), ids, weights.double(), w13.double(), w2.double())
    poison_allocator()
    out = triton_moe.moe_experts(x, ids, weights, w13, w2)
    assert out.shape == x.shape and not out.isnan().any()
    err = (out.double() - ref).abs().max().item()
    assert err < 3e-2 * max(1.0, ref.abs().max().item()), err
    # With the shared expert's output and the residual folded into the last kernel.
    shared = torch.randn(tokens, hidden, generator=g, device=DEV).bfloat16()
    res = torch.randn(tokens, hidden, generator=g, device=DEV).bfloat16()
    fused = triton_moe.moe_experts(x, ids, weights, w13, w2, shared=shared, residual=res)
    assert torch.equal(fused, res + (out + shared))  # the same bf16 rounding steps as the reference
    # The shared expert given by its weights, run as one more expert in the grouped GEMM.
    s13 = (torch.randn(2 * inter, hidden, generator=g, device=DEV) * hidden**-0.5).bfloat16()
    s2 = (torch.randn(hidden, inter, generator=g, device=DEV) * inter**-0.5).bfloat16()
    ref = reference.moe_experts(x.double(), ids, weights.double(), w13.double(), w2.double(), residual=res.double(),
                                shared_w13=s13.double(), shared_w2=s2.double())
    poison_allocator()
    folded = triton_moe.moe_experts(x, ids, weights, w13, w2, residual=res, shared_w13=s13, shared_w2=s2)
    assert not folded.isnan().any()
    err = (folded.double() - ref).abs().max().item()
    assert err < 3e-2 * max(1.0, ref.abs().max().item()), err


def test_gluon_sparse_mla_matches_float64_at_128_heads():
    """The warpgroup-MMA kernel DeepSeek's head count takes (one split, 70 tokens x 2 head groups):
    invalid slots, valid lengths shorter than a tile and than the top-k, against float64; the Triton
    entry point picks it."""
    from rooftop.engine.kernels import gluon_sparse_mla

    g = _gen(128)
    tokens, heads, topk = 70, 128, 512
    q = torch.randn(tokens, heads, 576, generator=g, device=DEV).bfloat16()
    kv = torch.randn(64, 64, 576, generator=g, device=DEV).bfloat16()
    slots = torch.randint(0, 64 * 64, (tokens, topk), generator=g, device=DEV)
    slots[3, 5:40] = -1
    lens = torch.randint(1, topk + 40, (tokens,), generator=g, device=DEV).int()
    lens[:3] = torch.tensor([1, 63, 65], dtype=torch.int32)
    masked = torch.where(torch.arange(topk, device=DEV)[None, :] < lens[:, None].long(), slots, -1)
    ref = reference.sparse_mla(q.double(), kv.double(), masked, 512, 0.05)
    assert triton_sparse_mla.default_config(tokens, heads, topk)["splits"] == 1
    poison_allocator()
    out = gluon_sparse_mla.sparse_mla(q, kv, slots, 512, 0.05, valid_lens=lens)
    assert not out.isnan().any() and (out.double() - ref).abs().max().item() < 2e-2
    auto = triton_sparse_mla.sparse_mla(q, kv, slots, 512, 0.05, valid_lens=lens)
    assert (auto.double() - ref).abs().max().item() < 2e-2
    ref_all = reference.sparse_mla(q.double(), kv.double(), slots, 512, 0.05)
    out = gluon_sparse_mla.sparse_mla(q[:, :, :512], kv, slots, 512, 0.05, q_rope=q[:, :, 512:])
    assert (out.double() - ref_all).abs().max().item() < 2e-2


# ---- skinny GEMMs ----

MATMUL_CASES = [  # rows, N, K: the `small` preset's decode projections, and shapes off every tile
    (1, 1504, 2048), (1, 2048, 4096), (1, 512, 2048), (16, 6144, 768), (33, 4096, 768), (64, 2048, 4096),
    (64, 11264, 2048), (5, 100, 300), (64, 17, 5632),
]


@pytest.mark.parametrize("case", MATMUL_CASES)
def test_linear_matches_float64(case):
    rows, n, k = case
    g = _gen(rows + n + k)
    x = torch.randn(rows, k, generator=g, device=DEV).bfloat16()
    w = (torch.randn(n, k, generator=g, device=DEV) * k**-0.5).bfloat16()
    ref = x.double() @ w.double().T
    poison_allocator()
    out = triton_matmul.linear(x, w)
    assert out.shape == (rows, n) and out.dtype == torch.bfloat16 and not out.isnan().any()
    err = (out.double() - ref).abs().max().item()
    assert err < 1e-2 * max(1.0, ref.abs().max().item()), (err, triton_matmul.default_config(rows, n, k))


@pytest.mark.parametrize("tokens", [9, 1])
def test_absorbed_attention_bmm_matches_torch(tokens):
    """The model's two per-head products, from the transposed views it passes (one token: W_UV^T, K
    contiguous, goes to the GEMV; W_UK stays in the tl.dot kernel)."""
    g = _gen(7)
    heads, nope, rank, v = 32, 128, 512, 128
    q = torch.randn(tokens, heads, nope, generator=g, device=DEV).bfloat16()
    w_kv = torch.randn(heads, nope + v, rank, generator=g, device=DEV).bfloat16() * rank**-0.5
    w_uk, w_uv = w_kv.split([nope, v], dim=1)
    lat = torch.randn(tokens, heads, rank, generator=g, device=DEV).bfloat16()
    for a, b in ((q.transpose(0, 1), w_uk), (lat.transpose(0, 1), w_uv.transpose(1, 2))):
        ref = torch.bmm(a.double(), b.double())
        poison_allocator()
        out = dispatch.bmm(a, b)
        assert out.shape == ref.shape and not out.isnan().any()
        assert (out.double() - ref).abs().max().item() < 1e-2 * max(1.0, ref.abs().max().item())
    # W_UV as the model runs it: written token-major through a head-major view, no copy after
    buf = torch.full((tokens, heads, v), float("nan"), device=DEV, dtype=torch.bfloat16)
    dispatch.bmm(lat.transpose(0, 1), w_uv.transpose(1, 2), out=buf.transpose(0, 1))
    ref = torch.bmm(lat.transpose(0, 1).double(), w_uv.transpose(1, 2).double()).transpose(0, 1)
    assert not buf.isnan().any() and (buf.double() - ref).abs().max().item() < 1e-2 * max(1.0, ref.abs().max().item())


# ---- dispatch, host syncs, graphs, greedy tokens ----

def test_in_kernel_merges_stay_right_over_graph_replays():
    """The kernels whose last program merges (sparse MLA's splits at 128 tokens x 16 heads, a split-K
    product, the router's chunks and its last token's pair layout, one token's down GEMV and its norm)
    re-arm their arrival counters:
    replays of one captured graph with new inputs, many programs racing to arrive last each time, all
    match the reference, and the counters end at 0."""
    from rooftop.engine.kernels import arrivals

    g = _gen(77)
    q = torch.randn(128, 16, 576, generator=g, device=DEV).bfloat16()
    kv = torch.randn(1024, 64, 576, generator=g, device=DEV).bfloat16()
    slots = torch.randint(0, 1024 * 64, (128, 2048), generator=g, device=DEV)
    x = torch.randn(2, 4096, generator=g, device=DEV).bfloat16()  # 2 rows: the tl.dot kernel (1 is the GEMV's)
    w = (torch.randn(2048, 4096, generator=g, device=DEV) * 4096**-0.5).bfloat16()
    xr = torch.randn(64, 2048, generator=g, device=DEV).bfloat16()
    gate = (torch.randn(32, 2048, generator=g, device=DEV) * 2048**-0.5).bfloat16()
    cfg = triton_sparse_mla.default_config(128, 16, 2048)
    assert triton_sparse_mla.merges_in_kernel(cfg, 512) and triton_matmul.default_config(2, 2048, 4096)["splits"] > 1
    # One token's experts as GEMVs: the down GEMV's last program norms the row.
    w13 = (torch.randn(8, 512, 2048, generator=g, device=DEV) * 2048**-0.5).bfloat16()
    w2 = (torch.randn(8, 2048, 256, generator=g, device=DEV) * 256**-0.5).bfloat16()
    s13, s2 = w13[7] * 0.5, w2[7] * 0.5
    ids1, wts1 = torch.tensor([[3, 0, 6, 1]], device=DEV), torch.rand(1, 4, generator=g, device=DEV)
    nw = (torch.rand(2048, generator=g, device=DEV) + 0.5).bfloat16()
    assert triton_moe.gemv_takes(1)

    def run():
        return (triton_sparse_mla.sparse_mla(q, kv, slots, 512, 0.04), triton_matmul.linear(x, w),
                triton_moe.route(xr, gate, 4, "sigmoid", True, 1.0),
                triton_moe.route_and_layout(xr[:12], gate, 4, "sigmoid", True, 1.0, 33, shared=True),
                triton_moe.moe_experts(xr[:1], ids1, wts1, w13, w2, residual=x[:1, :2048], shared_w13=s13,
                                       shared_w2=s2, next_norm=(nw, 1e-6)))

    run()  # compiles, and makes the counters, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run()
    for _ in range(3):
        for t in (q, kv, x, xr):
            t.copy_(torch.randn(t.shape, generator=g, device=DEV).bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        attn, proj, (rw, ids), (_, few_ids, layout), (moe_out, moe_normed) = outs
        ref, ref_normed = reference.moe_experts(xr[:1].double(), ids1, wts1.double(), w13.double(), w2.double(),
                                                residual=x[:1, :2048].double(), shared_w13=s13.double(),
                                                shared_w2=s2.double(), next_norm=(nw.double(), 1e-6))
        assert (moe_out.double() - ref).abs().max().item() < 3e-2 * ref.abs().max().item()
        assert (moe_normed.double() - ref_normed).abs().max().item() < 3e-2 * ref_normed.abs().max().item()
        assert torch.equal(few_ids, ids[:12])
        want = triton_moe.align_pairs(few_ids, 33, 16, shared=True)
        assert all(torch.equal(a, b) for a, b in zip(layout, want, strict=True))
        ref = reference.sparse_mla(q.double(), kv.double(), slots, 512, 0.04)
        assert (attn.double() - ref).abs().max().item() < 2e-2
        ref = x.double() @ w.double().T
        assert (proj.double() - ref).abs().max().item() < 1e-2 * max(1.0, ref.abs().max().item())
        w_ref, ids_ref = reference.route(xr.double(), gate.double(), 4, "sigmoid", True, 1.0)
        agree = (ids == ids_ref).all(-1)
        assert int(agree.sum()) >= 62 and (rw[agree].double() - w_ref[agree]).abs().max().item() < 1e-4
    assert int(arrivals.counters(torch.device(DEV), 1).abs().sum()) == 0


def test_dispatch_picks_triton_on_cuda(monkeypatch):
    monkeypatch.delenv("ROOFTOP_KERNELS", raising=False)
    assert dispatch.use_triton(torch.zeros(1, device=DEV))
    monkeypatch.setenv("ROOFTOP_KERNELS", "reference")
    assert not dispatch.use_triton(torch.zeros(1, device=DEV))


def _tiny_setup(seed=0):
    from rooftop.engine.kv.cache import KVCache
    from rooftop.engine.model.config import ModelConfig
    from rooftop.engine.model.weights import random_model

    config = ModelConfig.preset("tiny")
    model = random_model(config, seed=seed, device=DEV)
    return config, model, KVCache


def _prefill(model, cache, prompts, tables, block, capacity):
    from rooftop.engine.model.batch import build_batch

    batch = build_batch(prompts, [0] * len(prompts), tables, block, capacity, "actual", DEV)
    return model(batch, cache)


def test_decode_step_makes_no_host_sync(monkeypatch):
    from rooftop.engine.model.batch import build_batch

    monkeypatch.delenv("ROOFTOP_KERNELS", raising=False)
    config, model, KVCache = _tiny_setup()
    block, capacity = 64, 4096
    cache = KVCache(config, 64, block, torch.bfloat16, DEV)
    prompts = [[random.Random(i).randrange(256) for _ in range(30 + 40 * i)] for i in range(3)]
    tables = [[i * 4 + j for j in range(4)] for i in range(3)]
    _prefill(model, cache, prompts, tables, block, capacity)
    batch = build_batch([[1]] * 3, [len(p) for p in prompts], tables, block, capacity, "capacity", DEV)
    model(batch, cache)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        logits = model(batch, cache)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert logits.shape == (3, config.vocab_size)


def test_served_steps_launch_without_a_host_sync(monkeypatch):
    """ModelRunner.run as the engine calls it (graph replays, the previous step's picks gathered on the
    device, greedy, seeded and unseeded draws, <eos> banned by min_tokens, top logprobs) queues its
    work without waiting for the device, its forward's timing events included."""
    from rooftop.engine.model.config import EOS_ID
    from rooftop.engine.model_runner import ModelRunner, RunnerConfig
    from rooftop.engine.sequence import PENDING_TOKEN, SamplingParams, Sequence

    monkeypatch.delenv("ROOFTOP_KERNELS", raising=False)
    config, model, KVCache = _tiny_setup(seed=3)
    block, capacity, num_blocks = 16, 1024, 64
    cache = KVCache(config, num_blocks, block, torch.bfloat16, DEV)
    runner = ModelRunner(model, cache, RunnerConfig(block, capacity, max_batch=8, prefill_chunk=64),
                         torch.device(DEV))
    assert runner.graphs is not None and runner.prefill_graphs is not None
    # <eos> banned in every row for three steps (one index for all), then in two rows (an index a row)
    params = [SamplingParams(max_tokens=50, temperature=0.0, min_tokens=40, logprobs=2),
              SamplingParams(max_tokens=50, temperature=0.8, top_p=0.9, min_tokens=3),
              SamplingParams(max_tokens=50, temperature=1.0, seed=11, min_tokens=40)]
    seqs = [Sequence([1] + [random.Random(i).randrange(256) for _ in range(20 + 7 * i)], p)
            for i, p in enumerate(params)]
    for i, seq in enumerate(seqs):
        seq.block_table = [i * 8 + j for j in range(8)]
        seq.num_scheduled_tokens = seq.num_tokens
    previous = None
    for step in range(6):
        if step == 2:
            torch.cuda.synchronize()  # steps 0 and 1 compile what is left; from here on nothing may wait
            torch.cuda.set_sync_debug_mode("error")
        try:
            sampled, picks = runner.run(seqs, is_prefill=step == 0, previous=previous)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert sampled == seqs
        for seq in seqs:
            seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 1
        if previous is not None:  # the host reads a step's picks after launching the next one
            out = previous.sample.result()
            assert previous.forward_seconds() > 0  # its forward's CUDA events, read without a wait
            for seq, token in zip(seqs, out.token_ids, strict=True):
                seq.token_ids[-2] = token
        for seq in seqs:
            seq.append_token(PENDING_TOKEN)
        previous = picks
    out = previous.sample.result()
    assert all(0 <= t < config.vocab_size for t in out.token_ids) and out.token_ids[0] != EOS_ID
    assert len(out.top_ids[0]) == 2 and out.top_ids[0][0] == out.token_ids[0]


def test_prefill_graphs_match_the_eager_prefill(monkeypatch):
    """Chunks replayed in prefill graphs (padded to the next chunk size, with a padding sequence and
    empty rows) give the eager forward's logits and write the same cache rows; a chunk with too many
    sequences, or wider than the graphs, runs eagerly."""
    from rooftop.engine.cuda_graphs import PrefillGraphs
    from rooftop.engine.model.batch import build_batch

    monkeypatch.delenv("ROOFTOP_KERNELS", raising=False)
    config, model, KVCache = _tiny_setup(seed=5)
    block, capacity = 16, 1024
    num_blocks = 64 + 1
    caches = [KVCache(config, num_blocks, block, torch.float32, DEV) for _ in range(2)]
    g = _gen(9)
    for t in caches[0].latent + caches[0].index_k:
        t.normal_(generator=g)
    for a, b in zip(caches[0].latent + caches[0].index_k, caches[1].latent + caches[1].index_k, strict=True):
        b.copy_(a)
    model = model.float()
    graphs = PrefillGraphs(model, caches[1], [16, 32, 64], max_seqs=3, max_pages=capacity // block,
                           dummy_block=num_blocks - 1)
    rng = random.Random(2)
    chunks = [  # (cached, new) per sequence: exact fits, padding, ragged, past the top-k of 64
        [(0, 16)], [(0, 5)], [(100, 30)], [(0, 7), (40, 20), (130, 9)], [(0, 64)], [(200, 1), (0, 2)],
    ]
    for i, chunk in enumerate(chunks):
        tables = [[(s * 16 + j) % (num_blocks - 1) for j in range(-(-(c + n) // block))] for s, (c, n) in enumerate(chunk)]
        prompts = [[rng.randrange(256) for _ in range(n)] for _, n in chunk]
        batch = build_batch(prompts, [c for c, _ in chunk], tables, block, capacity, "actual", DEV)
        assert graphs.graph_tokens(batch) is not None, chunk
        eager = model(batch, caches[0])
        graphed = graphs.run(batch)
        assert graphed.shape == eager.shape
        text = torch.isfinite(eager)
        assert torch.equal(text, torch.isfinite(graphed))
        torch.testing.assert_close(graphed[text], eager[text], atol=2e-3, rtol=2e-3, msg=f"chunk {i}: {chunk}")
        slots = batch.slot_mapping
        for a, b in zip(caches[0].latent + caches[0].index_k, caches[1].latent + caches[1].index_k, strict=True):
            # Later layers' rows come from hidden states computed in a different tiling (tf32): 2e-3, as the logits.
            torch.testing.assert_close(b.view(-1, b.shape[-1])[slots], a.view(-1, a.shape[-1])[slots],
                                       atol=2e-3, rtol=2e-3)
    four = build_batch([[1, 2]] * 4, [0] * 4, [[j] for j in range(4)], block, capacity, "actual", DEV)
    assert graphs.graph_tokens(four) is None  # 4 sequences: the graphs hold 3
    wide = build_batch([[1] * 70], [0], [list(range(5))], block, capacity, "actual", DEV)
    assert graphs.graph_tokens(wide) is None  # 70 tokens: the largest graph holds 64
    text = torch.isfinite(model(four, caches[0]))
    torch.testing.assert_close(graphs.run(four)[text], model(four, caches[0])[text], atol=2e-3, rtol=2e-3)  # eager


def test_greedy_tokens_reference_vs_triton_with_graphs(monkeypatch, capsys):
    """Teacher-forced decode in three paths: torch reference in bf16, Triton + graphs in bf16, and the torch
    reference in float32 as the judge. Where the two bf16 paths pick different tokens, it is a tie if the
    float32 logits of the two tokens differ by no more than the two paths' own errors against float32 on that
    row (bf16 cannot tell them apart); else a mismatch. Ties are counted and reported."""
    import copy

    from rooftop.engine.cuda_graphs import DecodeGraphs
    from rooftop.engine.model.batch import build_batch

    config, model, KVCache = _tiny_setup(seed=3)
    model32 = copy.deepcopy(model).float()
    block, capacity, steps = 64, 2048, 24
    lens = [1, 5, 63, 64, 65, 200]  # lengths of 1 and longer than top-k (64)
    rng = random.Random(11)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in lens]
    tables = [[i * 8 + j for j in range(8)] for i in range(len(lens))]
    num_blocks = 8 * len(lens) + 1
    caches = {"ref": KVCache(config, num_blocks, block, torch.bfloat16, DEV),
              "tri": KVCache(config, num_blocks, block, torch.bfloat16, DEV),
              "f32": KVCache(config, num_blocks, block, torch.float32, DEV)}
    paths = {"ref": (model, "reference"), "tri": (model, "auto"), "f32": (model32, "reference")}

    def step(name, batch):
        m, mode = paths[name]
        monkeypatch.setenv("ROOFTOP_KERNELS", mode)
        return m(batch, caches[name]).float()

    prefill = build_batch(prompts, [0] * len(lens), tables, block, capacity, "actual", DEV)
    logits = {name: step(name, prefill) for name in paths}
    monkeypatch.setenv("ROOFTOP_KERNELS", "auto")
    graphs = DecodeGraphs(model, caches["tri"], [1, 2, 4, 8], max_pages=capacity // block, dummy_block=num_blocks - 1)
    ties = mismatches = compared = 0
    err = {"ref": 0.0, "tri": 0.0}
    seq_lens = list(lens)
    for _ in range(steps):
        top_ref, top_tri = logits["ref"].argmax(-1), logits["tri"].argmax(-1)
        for b in range(len(lens)):
            compared += 1
            truth = logits["f32"][b]
            text = torch.isfinite(truth)  # ids outside the head's text mask are -inf on every path
            e_ref = (logits["ref"][b][text] - truth[text]).abs().max().item()
            e_tri = (logits["tri"][b][text] - truth[text]).abs().max().item()
            err["ref"], err["tri"] = err["ref"] + e_ref, err["tri"] + e_tri
            a, c = int(top_ref[b]), int(top_tri[b])
            if a != c:
                if abs((truth[a] - truth[c]).item()) <= e_ref + e_tri:
                    ties += 1
                else:
                    mismatches += 1
        new = [[int(t)] for t in top_ref]  # everyone follows the bf16 reference's tokens
        batch = build_batch(new, seq_lens, tables, block, capacity, "actual", DEV)
        logits["ref"], logits["f32"] = step("ref", batch), step("f32", batch)
        logits["tri"] = graphs.run(batch).float()
        seq_lens = [n + 1 for n in seq_lens]
    with capsys.disabled():
        print(f"\ngreedy: {compared} tokens compared, {ties} ties within bf16 error, {mismatches} mismatches; "
              f"mean max|logit - float32| torch bf16 {err['ref'] / compared:.4f}, triton+graphs "
              f"{err['tri'] / compared:.4f}")
    assert mismatches == 0
    assert ties <= compared // 8
    assert err["tri"] <= 1.5 * err["ref"]  # the Triton path is no less accurate than the torch one


def test_absorbed_query_beside_both_ropes_in_one_launch():
    """One token at the `small` preset's shapes: the absorbed query (q_nope @ W_UK per head, from a
    strided slice of q and a slice of kv_b's weight) against float64, and both rotations as rope2's."""
    g = _gen(41)
    heads, nope, rope_dim, rank = 32, 128, 64, 512
    q = torch.randn(1, heads, nope + rope_dim, generator=g, device=DEV).bfloat16()
    w_kv = (torch.randn(heads, nope + 128, rank, generator=g, device=DEV) * rank**-0.5).bfloat16()
    w_uk = w_kv[:, :nope]
    index_q = torch.randn(1, 32, 128, generator=g, device=DEV).bfloat16()
    ang = torch.rand(1, rope_dim // 2, generator=g, device=DEV) * 6
    cos, sin = ang.cos(), ang.sin()
    assert dispatch.ABSORB_ROPE_ONE_LAUNCH
    absorbed, q_rope, index_rot = dispatch.absorb_rope2(q[..., :nope], w_uk, q[..., nope:], index_q, cos, sin)
    want = torch.bmm(q[..., :nope].transpose(0, 1).double(), w_uk.double()).transpose(0, 1)
    assert absorbed.shape == (1, heads, rank)
    assert (absorbed.double() - want).abs().max().item() < 1e-2 * max(1.0, want.abs().max().item())
    rotated = triton_norm_rope.rope2(q[..., nope:], index_q, cos, sin)
    assert torch.equal(q_rope, rotated[0]) and torch.equal(index_rot, rotated[1])


def test_pdl_launches_give_the_same_logits_over_graph_replays(monkeypatch):
    """One token's decode step at the `small` preset's shapes, captured with every PDL group launched by
    programmatic dependent launch (kernels start while the one before runs, weights load before the
    wait) and with none: the same logits bit for bit, replay after replay (a missing wait would race)."""
    from rooftop.engine.cuda_graphs import DecodeGraphs
    from rooftop.engine.kernels import pdl
    from rooftop.engine.kv.cache import KVCache
    from rooftop.engine.model.batch import build_batch
    from rooftop.engine.model.config import ModelConfig
    from rooftop.engine.model.weights import random_model

    config = ModelConfig.preset("small")
    model = random_model(config, seed=5, device=DEV)
    block, capacity, context = 64, 4096, 300
    cache = KVCache(config, 8, block, torch.bfloat16, DEV)
    for t in cache.latent + cache.index_k:
        t.normal_()
    graphs = {}
    for on in (False, True):
        monkeypatch.setattr(pdl, "ON", pdl.GROUPS if on else ())
        graphs[on] = DecodeGraphs(model, cache, [1], max_pages=capacity // block, dummy_block=7)
    batch = build_batch([[65]], [context - 1], [[0, 1, 2, 3, 4]], block, capacity, "actual", DEV)
    want = graphs[False].run(batch).float().clone()
    assert int(torch.isfinite(want).sum()) >= 64  # the text ids' logits (the rest are -inf)
    for _ in range(30):
        assert torch.equal(graphs[True].run(batch).float(), want)
        assert torch.equal(graphs[False].run(batch).float(), want)
