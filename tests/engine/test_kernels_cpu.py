"""Kernel dispatch on CPU (the torch reference), and the Triton kernels in Triton's interpreter (tiny
shapes; `triton` is pinned in requirements-dev.txt, so a missing one fails here)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rooftop.engine.kernels import dispatch, reference


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(3, 4, 16, generator=g)
    w = torch.randn(3, 4, generator=g)
    kc = torch.randn(6, 8, 16, generator=g)
    tables = torch.tensor([[1, 2, -1], [3, -1, -1], [4, 5, 0]], dtype=torch.int32)
    seq_lens = torch.tensor([10, 1, 20], dtype=torch.int32)
    return q, w, kc, tables, seq_lens


def test_auto_on_cpu_is_the_reference(monkeypatch):
    monkeypatch.delenv("ROOFTOP_KERNELS", raising=False)
    assert not dispatch.use_triton(torch.zeros(1))
    q, w, kc, tables, seq_lens = _inputs()
    got = dispatch.indexer_topk_decode(q, w, kc, tables, seq_lens, 3, 12)
    want = reference.indexer_topk_decode(q, w, kc, tables, seq_lens, 3, 12)
    assert torch.equal(got, want)
    assert int((got[1] >= 0).sum()) == 1 and int(got[1, 0]) == 0  # length 1: only position 0

    g = torch.Generator().manual_seed(1)
    qa, kv = torch.randn(2, 3, 24, generator=g), torch.randn(4, 8, 24, generator=g)
    slots = torch.tensor([[0, 5, -1, 17], [31, -1, -1, -1]])
    assert torch.equal(dispatch.sparse_mla(qa, kv, slots, 16, 0.25), reference.sparse_mla(qa, kv, slots, 16, 0.25))
    x = torch.randn(5, 8, generator=g)
    ids = torch.tensor([[0, 1], [1, 2], [2, 0], [0, 1], [3, 2]])
    tw = torch.rand(5, 2, generator=g)
    w13, w2 = torch.randn(4, 12, 8, generator=g), torch.randn(4, 8, 6, generator=g)
    assert torch.equal(dispatch.moe_experts(x, ids, tw, w13, w2), reference.moe_experts(x, ids, tw, w13, w2))


def test_reference_mode_wins_and_bad_mode_is_named(monkeypatch):
    monkeypatch.setenv("ROOFTOP_KERNELS", "reference")
    assert dispatch.kernel_mode() == "reference"
    assert not dispatch.use_triton(torch.zeros(1))
    monkeypatch.setenv("ROOFTOP_KERNELS", "cuda")
    with pytest.raises(ValueError, match="ROOFTOP_KERNELS"):
        dispatch.use_triton(torch.zeros(1))


# Runs in a child with TRITON_INTERPRET=1 set before triton is imported (it is read at decoration).
INTERPRETER_CHECK = textwrap.dedent("""
    import torch
    from rooftop.engine.kernels.interpreter import patch_numpy_index
    patch_numpy_index()
    from rooftop.engine.kernels import reference, triton_indexer, triton_moe, triton_norm_rope, triton_sparse_mla

    g = torch.Generator().manual_seed(0)
    # Sparse MLA: 3 tokens, 20 heads (two head tiles), 3 splits; invalid rows and a length-1 row.
    q, kv = torch.randn(3, 20, 80, generator=g), torch.randn(8, 16, 80, generator=g)
    slots = torch.randint(0, 128, (3, 100), generator=g)
    slots[1, 1:] = -1
    slots[2, 10:60] = -1
    cfg = {"BLOCK_H": 16, "BLOCK_N": 16, "splits": 3, "num_warps": 4, "num_stages": 1}
    ref = reference.sparse_mla(q.double(), kv.double(), slots, 64, 0.1)
    assert triton_sparse_mla.merges_in_kernel(cfg, 64, torch.float32)  # 16 heads x 4 x 64 x fp32: the last split merges
    for merge_bytes in (0, triton_sparse_mla.MERGE_IN_KERNEL_BYTES):  # the merge kernel, then in-kernel (as shipped)
        triton_sparse_mla.MERGE_IN_KERNEL_BYTES = merge_bytes
        out = triton_sparse_mla.sparse_mla(q, kv, slots, 64, 0.1, cfg)
        assert (out.double() - ref).abs().max() < 1e-4, f"sparse_mla merged with {merge_bytes} bytes in-kernel"
    cfg = {**cfg, "BLOCK_N": 32, "rows_as_m": True}  # the rows-as-M kernel (warpgroup MMA on sm_90)
    out = triton_sparse_mla.sparse_mla(q, kv, slots, 64, 0.1, cfg)
    assert (out.double() - ref).abs().max() < 1e-4, "sparse_mla rows as M"
    # A rank and RoPE width below their blocks (48 of 64, 8 of 16): the masked column blocks.
    q, kv = torch.randn(3, 20, 56, generator=g), torch.randn(8, 16, 56, generator=g)
    ref = reference.sparse_mla(q.double(), kv.double(), slots, 48, 0.1)
    for rows_as_m, splits in ((False, 3), (True, 3), (False, 1), (True, 1)):  # one split: no combine kernel
        uneven = {**cfg, "rows_as_m": rows_as_m, "splits": splits, "prefetch": True}
        out = triton_sparse_mla.sparse_mla(q, kv, slots, 48, 0.1, uneven)
        assert out.shape == (3, 20, 48) and (out.double() - ref).abs().max() < 1e-4, "sparse_mla uneven widths"

    # Indexer: lengths 1, below top-k and above it; 8 table columns but only the used ones read.
    q, w, kc = torch.randn(3, 4, 32, generator=g), torch.randn(3, 4, generator=g), torch.randn(40, 16, 32, generator=g)
    tables = torch.full((3, 8), -1, dtype=torch.int32)
    tables[0, 0] = 3
    tables[1, :2] = torch.tensor([5, 9])
    tables[2, :7] = torch.arange(20, 27)
    lens = torch.tensor([1, 20, 100], dtype=torch.int32)
    out = triton_indexer.indexer_topk_decode(q, w, kc, tables, lens, 8, 24)
    ref = reference.indexer_topk_decode(q.double(), w.double(), kc.double(), tables, lens, 8, 24)
    keys = kc.double()[tables.long().clamp(min=0)].view(3, -1, 32)
    scores = (torch.einsum("bhd,bkd->bkh", q.double(), keys).relu() * w.double()[:, None]).sum(-1)
    for b, n in enumerate([1, 20, 100]):
        got = out[b][out[b] >= 0]
        assert len(got) == min(n, 24) and len(set(got.tolist())) == len(got) and int(got.max()) < n, "indexer"
        assert torch.allclose(scores[b, got], scores[b, ref[b][ref[b] >= 0]], atol=1e-4), "indexer scores"

    # MoE: 5 tokens, 6 experts, top-3.
    x = torch.randn(5, 48, generator=g)
    ids = torch.stack([torch.randperm(6, generator=g)[:3] for _ in range(5)])
    tw = torch.rand(5, 3, generator=g)
    w13, w2 = torch.randn(6, 80, 48, generator=g) * 0.2, torch.randn(6, 48, 40, generator=g) * 0.2
    out = triton_moe.moe_experts(x, ids, tw, w13, w2)
    ref = reference.moe_experts(x.double(), ids, tw.double(), w13.double(), w2.double())
    assert (out.double() - ref).abs().max() < 1e-4, "moe"
    # The shared expert given by its weights: one more expert in the same kernels (both layouts).
    s13, s2, res = torch.randn(80, 48, generator=g) * 0.2, torch.randn(48, 40, generator=g) * 0.2, torch.randn(5, 48)
    ref = reference.moe_experts(x.double(), ids, tw.double(), w13.double(), w2.double(), residual=res.double(),
                                shared_w13=s13.double(), shared_w2=s2.double())
    for elements in (1 << 14, 0):
        triton_moe.ALIGN_KERNEL_ELEMENTS = elements
        out = triton_moe.moe_experts(x, ids, tw, w13, w2, residual=res, shared_w13=s13, shared_w2=s2)
        assert (out.double() - ref).abs().max() < 1e-4, "moe shared expert folded"
    triton_moe.ALIGN_KERNEL_ELEMENTS = 1 << 14
    # The next layer's norm in the last kernel, with a shared expert's output given.
    nw = torch.rand(48, generator=g) + 0.5
    out, normed = triton_moe.moe_experts(x, ids, tw, w13, w2, shared=s13[:48].T.contiguous()[:5], residual=res,
                                         next_norm=(nw, 1e-6))
    ref, ref_normed = reference.moe_experts(x.double(), ids, tw.double(), w13.double(), w2.double(),
                                            shared=s13[:48].T.contiguous()[:5].double(), residual=res.double(),
                                            next_norm=(nw.double(), 1e-6))
    assert (out.double() - ref).abs().max() < 1e-4 and (normed.double() - ref_normed).abs().max() < 1e-4, "moe norm"
    # One bf16 token: the experts as GEMVs (no pair layout; the combine and the norm in the down GEMV).
    assert triton_moe.gemv_takes(1) and not triton_moe.gemv_takes(2) and not triton_moe.gemv_takes(1, 4)
    xb, w13b, w2b, s13b, s2b = (t.bfloat16() for t in (x[:1], w13, w2, s13, s2))
    out, normed = triton_moe.moe_experts(xb, ids[:1], tw[:1], w13b, w2b, residual=res[:1].bfloat16(), shared_w13=s13b,
                                         shared_w2=s2b, next_norm=(nw, 1e-6))
    ref, ref_normed = reference.moe_experts(xb.double(), ids[:1], tw[:1].double(), w13b.double(), w2b.double(),
                                            residual=res[:1].bfloat16().double(), shared_w13=s13b.double(),
                                            shared_w2=s2b.double(), next_norm=(nw.double(), 1e-6))
    assert (out.double() - ref).abs().max() < 3e-2 * ref.abs().max(), "moe gemv, shared expert folded"
    assert (normed.double() - ref_normed).abs().max() < 3e-2 * ref_normed.abs().max(), "moe gemv norm"
    shared_out = torch.randn(1, 48, generator=g).bfloat16()
    triton_moe.DOWN_TILE_ELEMENTS = 512  # 4 pairs x a 64-row strip: 16 columns a chunk, K of 40 in three
    out = triton_moe.moe_experts(xb, ids[:1], tw[:1], w13b, w2b, shared=shared_out)
    triton_moe.DOWN_TILE_ELEMENTS = 8192
    ref = reference.moe_experts(xb.double(), ids[:1], tw[:1].double(), w13b.double(), w2b.double(),
                                shared=shared_out.double())
    assert (out.double() - ref).abs().max() < 3e-2 * ref.abs().max(), "moe gemv, shared output given, K in chunks"

    # Sparse MLA from a strided absorbed query and a separate RoPE part, work bounded by valid_lens.
    qa = torch.randn(20, 3, 64, generator=g).transpose(0, 1)  # [3, 20, 64], token stride 64
    qr = torch.randn(3, 20, 16, generator=g)
    kv = torch.randn(8, 16, 80, generator=g)
    slots = torch.randint(0, 128, (3, 100), generator=g)
    slots[0, 1:] = -1
    slots[2, 40:] = -1
    lens = torch.tensor([1, 100, 40], dtype=torch.int32)
    for rows_as_m, prefetch in ((False, False), (True, False), (False, True), (True, True)):
        cfg = {"BLOCK_H": 16, "BLOCK_N": 16, "splits": 4, "num_warps": 4, "num_stages": 1, "rows_as_m": rows_as_m,
               "prefetch": prefetch}
        out = triton_sparse_mla.sparse_mla(qa, kv, slots, 64, 0.1, cfg, q_rope=qr, valid_lens=lens)
        ref = reference.sparse_mla(qa.double(), kv.double(), slots, 64, 0.1, q_rope=qr.double())
        assert (out.double() - ref).abs().max() < 1e-4, "sparse_mla q_rope valid_lens"
    pos = torch.tensor([[0, 5, -1, 17], [31, -1, 3, -1]])
    tables = torch.tensor([[2, 3, -1], [1, 0, 4]], dtype=torch.int32)
    got = triton_sparse_mla.positions_to_slots(pos, torch.tensor([1, 0]), tables, 16)
    assert torch.equal(got, reference.positions_to_slots(pos, torch.tensor([1, 0]), tables, 16)), "slots"

    # Unordered indexer picks: the same set, valid ones first.
    lens = torch.tensor([1, 20, 100], dtype=torch.int32)
    q, w = torch.randn(3, 4, 32, generator=g), torch.randn(3, 4, generator=g)
    kc = torch.randn(40, 16, 32, generator=g)
    tables = torch.full((3, 8), -1, dtype=torch.int32)
    tables[0, 0] = 3
    tables[1, :2] = torch.tensor([5, 9])
    tables[2, :7] = torch.arange(20, 27)
    a = triton_indexer.indexer_topk_decode(q, w, kc, tables, lens, 8, 24)
    b = triton_indexer.indexer_topk_decode(q, w, kc, tables, lens, 8, 24, ordered=False)
    assert torch.equal(a.sort(1).values, b.sort(1).values), "unordered picks"
    for row, n in zip(b, [1, 20, 24]):
        assert (row[:n] >= 0).all() and (row[n:] == -1).all(), "valid picks first"
    # The same picks written as cache slots by the selection kernel (both of its branches: a length
    # below top-k and one above it).
    got = triton_indexer.indexer_topk_decode(q, w, kc, tables, lens, 8, 24, ordered=False, slots=True)
    assert torch.equal(got, reference.positions_to_slots(b, torch.arange(3), tables, 16)), "picks as slots"
    # Lengths past the scored pages (4 pages: 64 positions) are clamped in the kernels, slots too.
    ref = reference.indexer_topk_decode(q, w, kc, tables, lens, 4, 24)
    picks = triton_indexer.indexer_topk_decode(q, w, kc, tables, lens, 4, 24, ordered=False)
    assert torch.equal(picks.sort(1).values, ref.sort(1).values) and int(picks.max()) < 64, "clamped lengths"
    got = triton_indexer.indexer_topk_decode(q, w, kc, tables, lens, 4, 24, ordered=False, slots=True)
    assert torch.equal(got, reference.positions_to_slots(picks, torch.arange(3), tables, 16)), "clamped slots"

    # Prefill picks: each new token a query of its own over its sequence's table, up to its position.
    q, w = torch.randn(7, 4, 32, generator=g), torch.randn(7, 4, generator=g)
    kc = torch.randn(40, 16, 32, generator=g)
    tables = torch.full((2, 8), -1, dtype=torch.int32)
    tables[0, :2] = torch.tensor([5, 9])
    tables[1, :4] = torch.arange(20, 24)
    positions = torch.tensor([17, 18, 19, 56, 57, 58, 59])  # 3 new after 17 cached; 4 new after 56
    token_seq = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    got = triton_indexer.indexer_topk_prefill(q, w, kc, tables, token_seq, positions, 4, 24)
    ref = reference.indexer_topk_prefill(q.double(), w.double(), kc.double(), tables, [20, 60], [3, 4], positions, 24)
    for t in range(7):
        n = min(int(positions[t]) + 1, 24)
        assert (got[t, :n] >= 0).all() and (got[t, n:] == -1).all(), "prefill picks valid first"
        assert torch.equal(got[t, :n].sort().values, ref[t, :n].sort().values), "prefill picks"
    triton_indexer.PREFILL_SCORE_ELEMENTS = 100  # a token a slice
    assert torch.equal(triton_indexer.indexer_topk_prefill(q, w, kc, tables, token_seq, positions, 4, 24), got), \
        "prefill slices"
    triton_indexer.PREFILL_SCORE_ELEMENTS = 1 << 25

    # Norms, RoPE, the cache-row write, the router and the MoE layout kernel.
    x, res, wn = torch.randn(5, 48, generator=g), torch.randn(5, 48, generator=g), torch.rand(48, generator=g) + 0.5
    assert (triton_norm_rope.rms_norm(x, wn, 1e-6) - reference.rms_norm(x, wn, 1e-6)).abs().max() < 1e-5, "rms"
    got, want = triton_norm_rope.add_rms_norm(x, res, wn, 1e-6), reference.add_rms_norm(x, res, wn, 1e-6)
    assert all((a - b).abs().max() < 1e-5 for a, b in zip(got, want)), "add_rms"
    cos, sin = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    xq = torch.randn(5, 3, 40, generator=g)[..., 8:]  # strided, rotary on the first 16 of 32
    assert torch.equal(triton_norm_rope.rope(xq, cos, sin), reference.rope(xq, cos, sin)), "rope"
    # Two tensors in one launch: different heads, widths and a pass-through tail on the second.
    yq = torch.randn(5, 2, 24, generator=g)
    got = triton_norm_rope.rope2(xq, yq, cos, sin)
    assert all(torch.equal(a, b) for a, b in zip(got, reference.rope2(xq, yq, cos, sin), strict=True)), "rope2"
    # One token's absorbed query (a strided slice of q, 40 columns: 16-wide strips, the last short) beside
    # both rotations, in one launch.
    q1 = torch.randn(1, 3, 44, generator=g)
    w_uk = torch.randn(3, 20, 40, generator=g)
    triton_norm_rope.ABSORB_PROGRAM_BYTES = 2048  # [32, 16] fp32 strips
    got = triton_norm_rope.absorb_rope2(q1[..., :20], w_uk, q1[..., 20:], yq[:1], cos[:1], sin[:1])
    triton_norm_rope.ABSORB_PROGRAM_BYTES = 8 << 10
    want = reference.absorb_rope2(q1[..., :20].double(), w_uk.double(), q1[..., 20:], yq[:1], cos[:1], sin[:1])
    assert (got[0].double() - want[0]).abs().max() < 1e-4 and got[0].shape == (1, 3, 40), "absorb_rope2: product"
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), "absorb_rope2: rotations"
    slot_mapping = torch.tensor([3, 9, 17, 30, 31])
    for width, norm_dim, rope_start in ((80, 64, 64), (32, 32, 0)):
        rows = torch.randn(5, width, generator=g)
        nw = torch.rand(norm_dim, generator=g) + 0.5
        c1, c2 = torch.zeros(4, 8, width), torch.zeros(4, 8, width)
        triton_norm_rope.norm_rope_store(rows, nw, 1e-6, norm_dim, cos, sin, rope_start, c1, slot_mapping)
        reference.norm_rope_store(rows, nw, 1e-6, norm_dim, cos, sin, rope_start, c2, slot_mapping)
        assert (c1 - c2).abs().max() < 1e-5, "norm_rope_store"
    # Both rows of a token in one launch (MLA's latent row, the indexer's key), as the model writes them.
    rows_a, rows_b = torch.randn(5, 80, generator=g), torch.randn(5, 32, generator=g)
    wa, wb = torch.rand(64, generator=g) + 0.5, torch.rand(32, generator=g) + 0.5
    got_caches = [torch.zeros(4, 8, 80), torch.zeros(4, 8, 32)]
    want_caches = [torch.zeros(4, 8, 80), torch.zeros(4, 8, 32)]
    for fn, (ca, cb) in ((triton_norm_rope.norm_rope_store2, got_caches), (reference.norm_rope_store2, want_caches)):
        fn(reference.CachedRows(rows_a, wa, 1e-6, 64, 64, ca), reference.CachedRows(rows_b, wb, 1e-5, 32, 0, cb),
           cos, sin, slot_mapping)
    assert all((a - b).abs().max() < 1e-5 for a, b in zip(got_caches, want_caches, strict=True)), "norm_rope_store2"
    # With a third row a token normed in the same launch (the q latent), wider than both cached rows.
    xn, wn3 = torch.randn(5, 100, generator=g)[:, :96], torch.rand(96, generator=g) + 0.5  # row stride 100
    normed = []
    for fn, (ca, cb) in ((triton_norm_rope.norm_rope_store2, got_caches), (reference.norm_rope_store2, want_caches)):
        normed.append(fn(reference.CachedRows(rows_a, wa, 1e-6, 64, 64, ca), reference.CachedRows(rows_b, wb, 1e-5, 32, 0, cb),
                         cos, sin, slot_mapping, reference.NormRows(xn, wn3, 1e-6)))
    assert normed[0].shape == (5, 96) and (normed[0] - normed[1]).abs().max() < 1e-5, "norm_rope_store2 with a norm"
    assert all((a - b).abs().max() < 1e-5 for a, b in zip(got_caches, want_caches, strict=True)), "norm_rope_store2"
    x, gate = torch.randn(7, 64, generator=g), torch.randn(8, 64, generator=g)
    for scoring in ("sigmoid", "softmax"):
        got, want = triton_moe.route(x, gate, 2, scoring, True, 1.5), reference.route(x, gate, 2, scoring, True, 1.5)
        assert (got[0] - want[0]).abs().max() < 1e-5 and torch.equal(got[1], want[1]), "route " + scoring
    # 32 experts over 1024 hidden: 4 chunks a token, the last to finish selects.
    x, gate = torch.randn(3, 1024, generator=g), torch.randn(32, 1024, generator=g) * 1024**-0.5
    got, want = triton_moe.route(x, gate, 4, "sigmoid", True, 1.0), reference.route(x, gate, 4, "sigmoid", True, 1.0)
    assert (got[0] - want[0]).abs().max() < 1e-5 and torch.equal(got[1], want[1]), "route over chunks"
    ids = torch.randint(0, 8, (7, 2), generator=g)
    kernel_layout = triton_moe.align_pairs(ids, 8, 16)
    shared_layout = triton_moe.align_pairs(ids, 9, 16, shared=True)  # a shared pair a token: expert 8
    many = torch.randint(0, 8, (40, 2), generator=g)  # 80 pairs: past ALIGN_FEW_PAIRS
    tiered = triton_moe.align_pairs(many, 8, 16)  # a [128, 8] one-hot (ALIGN_TIERS)
    assert triton_moe._layout(40, 2, 8, 16, False).block_p == 128
    triton_moe.ALIGN_TIERS = False  # a [2048, 8] one-hot: the same layout
    assert all(torch.equal(a, b) for a, b in zip(tiered, triton_moe.align_pairs(many, 8, 16))), "align in a tier"
    triton_moe.ALIGN_TIERS = True
    triton_moe.ALIGN_KERNEL_ELEMENTS = 0  # the torch layout path
    assert all(torch.equal(a, b) for a, b in zip(tiered, triton_moe.align_pairs(many, 8, 16))), "align, 80 pairs"
    assert all(torch.equal(a, b) for a, b in zip(kernel_layout, triton_moe.align_pairs(ids, 8, 16))), "align"
    assert all(torch.equal(a, b) for a, b in zip(shared_layout, triton_moe.align_pairs(ids, 9, 16, shared=True))), \
        "align with the shared expert"
    triton_moe.ALIGN_KERNEL_ELEMENTS = 1 << 14
    assert triton_moe.fold_fits(8, 8, 32) and not triton_moe.fold_fits(4, 8, 256)  # 4 x 9 pairs > 16384 / 512
    # The router's kernel lays the pairs out too (the last token selected does it), with and without the
    # shared expert, twice (the counters re-armed); too many pairs for one program: no layout.
    x, gate = torch.randn(7, 1024, generator=g), torch.randn(8, 1024, generator=g) * 1024**-0.5
    for experts, shared in ((8, False), (9, True), (8, False)):
        w, i, layout = triton_moe.route_and_layout(x, gate, 2, "sigmoid", True, 1.0, experts, shared)
        want = reference.route(x, gate, 2, "sigmoid", True, 1.0)
        assert (w - want[0]).abs().max() < 1e-5 and torch.equal(i, want[1]), "route and layout: picks"
        assert all(torch.equal(a, b) for a, b in zip(layout, triton_moe.align_pairs(i, experts, 16, shared=shared))), \
            "route and layout: layout"
    triton_moe.ALIGN_KERNEL_ELEMENTS = 64  # one program takes 8 pairs of 8 experts
    assert triton_moe.route_and_layout(x[:5], gate, 2, "sigmoid", True, 1.0, 8)[2] is None, \
        "10 pairs: the layout is left to moe_experts"
    triton_moe.ALIGN_KERNEL_ELEMENTS = 1 << 14

    # Skinny GEMMs: rows below and above a tile, N and K off the tiles, K split over programs, and
    # the absorbed attention's batched products from transposed views.
    from rooftop.engine.kernels import triton_matmul
    for rows, n, k, cfg in ((1, 40, 48, None), (5, 24, 100, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16,
                                                              "splits": 3, "num_warps": 4, "num_stages": 2}),
                            (20, 17, 64, None), (40, 33, 24, {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16,
                                                              "splits": 2, "num_warps": 4, "num_stages": 2})):
        x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
        got = triton_matmul.linear(x, w, cfg)
        assert got.shape == (rows, n) and (got.double() - x.double() @ w.double().T).abs().max() < 1e-4, "linear"
    a = torch.randn(3, 6, 32, generator=g).transpose(0, 1)  # [6 heads, 3 tokens, 32], token stride 32 * 6
    b = torch.randn(6, 40, 32, generator=g)
    got = triton_matmul.bmm(a, b.transpose(1, 2))
    assert (got.double() - torch.bmm(a.double(), b.double().transpose(1, 2))).abs().max() < 1e-4, "bmm"
    # One row against a K-contiguous weight: the GEMV (K off its chunk, a strided row, heads as batch).
    for n, k in ((37, 300), (5, 2048)):
        x, w = torch.randn(3, k, generator=g)[1:2], torch.randn(n, k, generator=g)
        got = triton_matmul.linear(x, w)
        assert (got.double() - x.double() @ w.double().T).abs().max() < 1e-4, ("gemv", n, k)
    got = triton_matmul.bmm(a[:, :1], b.transpose(1, 2))
    assert (got.double() - torch.bmm(a[:, :1].double(), b.double().transpose(1, 2))).abs().max() < 1e-4, "gemv bmm"
    assert triton_matmul.gemv_config(1504, 2048) == {"BLOCK_N": 2, "BLOCK_K": 2048, "num_warps": 8}
    # K split over a batch of products: the last split of each (batch, tile) sums in-kernel.
    split_cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "splits": 2, "num_warps": 4, "num_stages": 2}
    for _ in range(2):  # the second call finds the counters re-armed
        got = triton_matmul.bmm(a, b.transpose(1, 2), split_cfg)
        assert (got.double() - torch.bmm(a.double(), b.double().transpose(1, 2))).abs().max() < 1e-4, "bmm split"
    # Written into a token-major buffer through its head-major view (how the model's W_UV lands): one
    # split, K split (the last split's sum takes the buffer's row stride) and the GEMV.
    want = torch.bmm(a.double(), b.double().transpose(1, 2)).transpose(0, 1)  # [3 tokens, 6 heads, 40]
    for cfg, rows in ((None, 3), (split_cfg, 3), (None, 1)):
        buf = torch.full((rows, 6, 40), float("nan"))
        got = triton_matmul.bmm(a[:, :rows], b.transpose(1, 2), cfg, out=buf.transpose(0, 1))
        assert got.data_ptr() == buf.data_ptr() and (buf.double() - want[:rows]).abs().max() < 1e-4, ("bmm out", cfg)
    try:
        triton_matmul.bmm(a, b.transpose(1, 2), out=torch.empty(6, 40, 3).transpose(1, 2))
        raise AssertionError("bmm took an out whose columns are strided")
    except ValueError as err:
        assert "contiguous columns" in str(err), err
    buf = torch.full((3, 6, 40), float("nan"))
    reference.bmm(a, b.transpose(1, 2), out=buf.transpose(0, 1))
    assert (buf.double() - want).abs().max() < 1e-4, "reference bmm out"
    from rooftop.engine.kernels import arrivals
    assert int(arrivals.counters(torch.device("cpu"), 1).abs().sum()) == 0, "arrival counters re-armed"
    assert triton_matmul.default_config(1, 2048, 4096)["splits"] == 4  # from 4096 deep: K split
    assert triton_matmul.default_config(1, 512, 2048)["splits"] == 1
    assert triton_matmul.default_config(64, 512, 2048)["splits"] > 1  # more rows: sized to the SMs

    # A step's inputs: 130 sequences (past the kernel's 128 a pass), one of them empty, long positions.
    from rooftop.engine.kernels import triton_norm_rope
    lens = torch.randint(0, 4, (130,), generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).int()
    n_tok = int(cu[-1])
    ids, pos = torch.randint(0, 50, (n_tok,), generator=g), torch.randint(0, 200000, (n_tok,), generator=g)
    emb, nw = torch.randn(50, 48, generator=g), torch.rand(48, generator=g) + 0.5
    freq = 1.0 / 10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16)
    got = triton_norm_rope.step_inputs(ids, pos, cu, emb, nw, 1e-6, freq, 2048)
    want = reference.step_inputs(ids, pos, cu, emb, nw, 1e-6, freq, 2048)
    for name, a, b in zip(want._fields, got, want, strict=True):
        exact = name in ("x", "token_seq", "valid_lens")
        assert a.dtype == b.dtype and a.shape == b.shape and (torch.equal(a, b) if exact else torch.allclose(a, b, atol=1e-4)), name

    # The whole tiny model, one decode step: reference vs Triton kernels (float32, same weights and cache).
    import os
    from rooftop.engine.kv.cache import KVCache
    from rooftop.engine.model.batch import build_batch
    from rooftop.engine.model.config import ModelConfig
    from rooftop.engine.model.weights import random_model
    config = ModelConfig.preset("tiny")
    model = random_model(config, seed=0)
    caches = [KVCache(config, 40, 16, torch.float32, "cpu") for _ in range(2)]
    for t in caches[0].latent + caches[0].index_k:
        t.normal_(generator=g)
    for a, b in zip(caches[0].latent + caches[0].index_k, caches[1].latent + caches[1].index_k):
        b.copy_(a)
    steps = {
        "decode": build_batch([[65 + s] for s in range(4)], [40, 3, 63, 20],
                              [[s * 4 + j for j in range(4)] for s in range(4)], 16, 1024, "actual", "cpu"),
        # A prefill step too: a whole prompt, and a chunk after 100 cached tokens (past tiny's top-k of 64).
        "prefill": build_batch([[66, 67, 68, 69, 70], [71, 72, 73]], [0, 100],
                               [[16, 17, 18, 19], list(range(20, 28))], 16, 1024, "actual", "cpu"),
    }
    for name, batch in steps.items():
        logits = []
        for mode, cache in zip(("reference", "triton"), caches):
            os.environ["ROOFTOP_KERNELS"] = mode
            logits.append(model(batch, cache))
        text = torch.isfinite(logits[0])
        assert torch.equal(text, torch.isfinite(logits[1])), name + " text mask"
        assert (logits[0][text] - logits[1][text]).abs().max() < 1e-4, name + " logits"
    assert all((a - b).abs().max() < 1e-4 for a, b in zip(caches[0].latent + caches[0].index_k,
                                                          caches[1].latent + caches[1].index_k)), "model cache"
    print("interpreter ok")
""")


@pytest.mark.timeout(240)
def test_triton_kernels_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", INTERPRETER_CHECK], env=env, capture_output=True, text=True,
                          timeout=230)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "interpreter ok" in proc.stdout


def test_stacked_projection_matches_each_linear_and_follows_weight_changes(monkeypatch):
    """`project` on the Triton path: one GEMM over stacked weights, rebuilt when a weight changes."""
    from torch import nn

    from rooftop.engine.model.layers import project

    g = torch.Generator().manual_seed(0)
    owner = nn.Module()
    owner.a, owner.b = nn.Linear(8, 5, bias=False), nn.Linear(8, 3, bias=False)
    x = torch.randn(4, 8, generator=g)
    monkeypatch.setenv("ROOFTOP_KERNELS", "triton")
    assert dispatch.triton_available()
    got = project(owner, x, [owner.a, owner.b])
    assert [t.shape for t in got] == [(4, 5), (4, 3)]
    torch.testing.assert_close(got[0], owner.a(x))
    torch.testing.assert_close(got[1], owner.b(x))
    with torch.no_grad():
        owner.b.weight.mul_(2)  # in place: the cached stack must not serve the old values
    torch.testing.assert_close(project(owner, x, [owner.a, owner.b])[1], owner.b(x))
    # A second set of Linears on the same owner (attention stacks x's and the q latent's): its own stack.
    owner.c = nn.Linear(8, 2, bias=False)
    torch.testing.assert_close(project(owner, x, [owner.c, owner.a])[0], owner.c(x))
    torch.testing.assert_close(project(owner, x, [owner.a, owner.b])[1], owner.b(x))
    assert len(owner.__dict__["_stacked_weights"]) == 2
    monkeypatch.setenv("ROOFTOP_KERNELS", "reference")
    assert not any(k.startswith("_stacked") for k in owner.state_dict())


@pytest.mark.timeout(120)
def test_sparse_mla_default_tiles_keep_two_row_tiles_in_flight_on_hopper():
    """Compiled for sm_90 on the CPU: the shipped tiles get two row buffers a program. Without the
    slot prefetch Triton 3.6's pipeliner gives the same tile one (the H200's 60% of copy); if a
    Triton upgrade changes that, the prefetch may no longer be needed."""
    from rooftop.engine.kernels import triton_sparse_mla
    from rooftop.engine.kernels.compile_check import sparse_mla_pipeline

    for batch, heads in ((128, 16), (128, 32), (64, 32)):  # the last: the engine's C=64, merged in-kernel
        cfg = triton_sparse_mla.default_config(batch, heads, 2048)
        got = sparse_mla_pipeline(cfg)
        assert cfg["prefetch"] and got["row_buffers"] == cfg["num_stages"] - 1 == 2, (heads, got)
        assert got["shared_bytes"] * 2 <= 228 * 1024, "two programs an SM"
    assert sparse_mla_pipeline({**cfg, "prefetch": False})["row_buffers"] == 1
    cfg = triton_sparse_mla.default_config(64, 128, 2048)  # DeepSeek's heads: rows as M, one program an SM
    got = sparse_mla_pipeline(cfg)
    assert cfg["rows_as_m"] and got["row_buffers"] == 2 and got["shared_bytes"] <= 228 * 1024, got


def test_sparse_mla_splits_32_heads_into_16_head_programs_up_to_16_tokens():
    """Up to SPLIT_HEADS_MAX_TOKENS tokens, 32 heads run as two 16-head groups, one program an SM (faster
    at 1-16 tokens on the H200 whatever the context); past it, 32-head programs, two an SM (16-head ones
    lost 13% at 64 tokens and a 4096-token context). 16 heads and 128 heads keep their tiles."""
    from rooftop.engine.kernels import triton_sparse_mla as sm

    def tile(tokens, heads):
        cfg = sm.default_config(tokens, heads, 2048)
        return cfg["BLOCK_H"], cfg["splits"]

    assert [tile(t, 32) for t in (1, 8, 16, 17, 64)] == [(16, 16), (16, 8), (16, 4), (32, 8), (32, 4)]
    assert [tile(t, 16) for t in (1, 16, 64)] == [(16, 16), (16, 16), (16, 4)]
    assert tile(1, 128) == (64, 16) and tile(64, 128) == (64, 1)


def test_sparse_mla_merge_plan_follows_the_measured_shapes():
    """Where the last split merges in-kernel on 16-bit partials, and where fp32 partials go to the
    merge kernel (the H200 A/B in triton_sparse_mla's MERGE_IN_KERNEL_BYTES comment)."""
    from rooftop.engine.kernels import triton_sparse_mla as sm

    def plan(batch, heads, dtype=torch.bfloat16):
        return sm.merge_plan(sm.default_config(batch, heads, 2048), 512, dtype)

    assert plan(64, 16) == (True, torch.bfloat16) and plan(128, 16) == (True, torch.bfloat16)
    assert plan(64, 32) == (True, torch.bfloat16)  # 4 splits x 32 heads: 128 KB
    assert plan(32, 16) == (False, torch.float32)  # 8 splits: the merge kernel
    assert plan(1, 32) == (False, torch.float32)  # 16 splits, 512 KB
    assert plan(128, 16, torch.float32) == (True, torch.float32)  # fp32 outputs keep fp32 partials,
    assert plan(64, 16, torch.float32) == (False, torch.float32)  # with half the bytes in-kernel
    assert plan(128, 128)[0] is False  # one split: nothing to merge


def test_gluon_sparse_mla_is_picked_only_where_it_was_measured(monkeypatch):
    """The Gluon kernel takes one-split calls of 64+ heads on sm_90 with Triton >= 3.6; a CPU tensor,
    fewer heads or an older Triton keep the Triton kernels."""
    pytest.importorskip("triton")
    from rooftop.engine.kernels import triton_sparse_mla

    kv = torch.zeros(1, 1, 576, dtype=torch.bfloat16)
    assert not triton_sparse_mla._gluon_takes(torch.zeros(1, 128, 576, dtype=torch.bfloat16), kv, 512)
    for version, want in (("3.6.0", (3, 6)), ("3.10.1+git1234", (3, 10)), ("4.0", (4, 0)), ("3.7rc1", (3, 7))):
        monkeypatch.setattr(triton_sparse_mla.triton, "__version__", version)
        assert triton_sparse_mla._triton_version() == want
    monkeypatch.setattr(triton_sparse_mla.triton, "__version__", "3.5.1")
    assert triton_sparse_mla._triton_version() < triton_sparse_mla.GLUON_MIN_TRITON


def test_gluon_sparse_mla_compiles_for_hopper_within_its_budget():
    """The Gluon kernel's default build for sm_90, on a CPU: within a block's 227 KB of shared memory,
    no spills, and its MMAs are warpgroup MMAs (36 score k-steps + 4 output ones a tile)."""
    pytest.importorskip("triton.experimental.gluon")
    from rooftop.engine.kernels import compile_check

    got = compile_check.gluon_sparse_mla_build()
    assert got["shared_bytes"] <= compile_check.SM90_SHARED_BYTES, got
    assert got["spill_bytes"] == 0 and got["registers"] <= 255, got
    assert got["wgmma"] == 40, got


def test_pdl_is_chosen_per_launch_and_never_off_a_hopper_gpu(monkeypatch):
    from rooftop.engine.kernels import pdl

    cpu = torch.device("cpu")
    assert not pdl.supported(cpu)
    assert pdl.args("gemv", cpu) == {"PDL": False, "launch_pdl": False}  # the interpreter never gets it
    monkeypatch.setattr(pdl, "supported", lambda device: True)
    monkeypatch.setattr(pdl, "ON", ("gemv", "norms"))
    assert pdl.on("gemv", cpu) and pdl.on("norms", cpu, pdl.MAX_TOKENS)
    assert not pdl.on("norms", cpu, pdl.MAX_TOKENS + 1) and not pdl.on("attention", cpu)
    assert pdl.args("gemv", cpu)["launch_pdl"] and not pdl.args("gemv", cpu, early=False)["launch_pdl"]
    with pytest.raises(ValueError, match="pdl group 'gemm'"):
        pdl.on("gemm", cpu)
