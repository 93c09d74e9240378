"""Kernel dispatch on CPU (the torch reference), and the Triton kernels in Triton's interpreter when
`triton` is installed (tiny shapes; skipped without it)."""

import importlib.util
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
    import triton.runtime.interpreter as interp
    if hasattr(interp, "_patch_lang_tensor"):
        # Triton 3.6's interpreter turns loop bounds into ints with int(ndarray); NumPy >= 2.4 refuses
        # that for a 1-element array. Take its one element instead.
        original = interp._patch_lang_tensor
        def patched(tensor, scope):
            original(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
        interp._patch_lang_tensor = patched
    from rooftop.engine.kernels import reference, triton_indexer, triton_moe, triton_sparse_mla

    g = torch.Generator().manual_seed(0)
    # Sparse MLA: 3 tokens, 20 heads (two head tiles), 3 splits; invalid rows and a length-1 row.
    q, kv = torch.randn(3, 20, 80, generator=g), torch.randn(8, 16, 80, generator=g)
    slots = torch.randint(0, 128, (3, 100), generator=g)
    slots[1, 1:] = -1
    slots[2, 10:60] = -1
    cfg = {"BLOCK_H": 16, "BLOCK_N": 16, "splits": 3, "num_warps": 4, "num_stages": 1}
    out = triton_sparse_mla.sparse_mla(q, kv, slots, 64, 0.1, cfg)
    ref = reference.sparse_mla(q.double(), kv.double(), slots, 64, 0.1)
    assert (out.double() - ref).abs().max() < 1e-4, "sparse_mla"
    cfg = {**cfg, "BLOCK_N": 32, "rows_as_m": True}  # the rows-as-M kernel (warpgroup MMA on sm_90)
    out = triton_sparse_mla.sparse_mla(q, kv, slots, 64, 0.1, cfg)
    assert (out.double() - ref).abs().max() < 1e-4, "sparse_mla rows as M"

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
    print("interpreter ok")
""")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
@pytest.mark.timeout(240)
def test_triton_kernels_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", INTERPRETER_CHECK], env=env, capture_output=True, text=True,
                          timeout=230)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "interpreter ok" in proc.stdout
