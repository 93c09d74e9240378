"""The indexer's two bounds, and the reference kernels against plain float64 math."""

import math
import random

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from rooftop.engine.kernels import reference as kernels
from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.batch import build_batch
from rooftop.engine.model.config import ModelConfig
from rooftop.engine.model.indexer import Indexer
from rooftop.engine.model.weights import random_model

BLOCK = 8
CONFIG = ModelConfig(
    hidden_size=64, num_hidden_layers=3, first_k_dense_replace=1, intermediate_size=96,
    moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, num_attention_heads=2,
    q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    index_n_heads=8, index_head_dim=16, index_topk=12,
)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: these ops are tiny, and on a busy 2-core box threads mostly wait on each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def random_paged_keys(seq_lens, dim, gen, num_blocks=64):
    """A paged key cache with a shuffled block table per sequence, and the keys in order per sequence."""
    cache = torch.randn(num_blocks, BLOCK, dim, generator=gen)
    blocks = list(range(num_blocks))
    random.Random(0).shuffle(blocks)
    width = max(-(-n // BLOCK) for n in seq_lens)
    tables, ordered = [], []
    for n in seq_lens:
        own = [blocks.pop() for _ in range(-(-n // BLOCK))]
        tables.append(own + [-1] * (width - len(own)))
        ordered.append(cache[own].reshape(-1, dim)[:n])
    return cache, torch.tensor(tables, dtype=torch.int32), ordered


def brute_force_topk(q, w, keys, topk):
    """float64 scores of one query against its keys -> set of the top min(topk, len) positions."""
    scores = ((keys.double() @ q.double().T).relu() * w.double()).sum(-1)
    return set(scores.topk(min(topk, len(keys))).indices.tolist())


def test_decode_bounds_pick_the_same_topk_as_brute_force():
    gen = torch.Generator().manual_seed(0)
    seq_lens = [5, 40, 17, 33]  # one shorter than top-k
    heads, dim, topk = 8, 16, 12
    cache, tables, ordered = random_paged_keys(seq_lens, dim, gen)
    q = torch.randn(len(seq_lens), heads, dim, generator=gen)
    w = torch.randn(len(seq_lens), heads, generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    actual = kernels.indexer_topk_decode(q, w, cache, tables, lens, math.ceil(max(seq_lens) / BLOCK), topk)
    cap_pages = 20  # wider than the table: padded with -1, clamped to block 0, masked
    capacity = kernels.indexer_topk_decode(q, w, cache, tables, lens, cap_pages, topk)
    assert actual.shape == capacity.shape == (4, topk)
    for b, n in enumerate(seq_lens):
        want = brute_force_topk(q[b], w[b], ordered[b], topk)
        for got in (actual[b], capacity[b]):
            picked = got[got >= 0].tolist()
            assert set(picked) == want and len(picked) == min(topk, n)
            assert (got[len(picked) :] == -1).all()


def test_prefill_indexer_is_causal_and_agrees_with_decode():
    gen = torch.Generator().manual_seed(1)
    seq_lens, query_lens = [30, 21], [10, 21]
    heads, dim, topk = 8, 16, 12
    cache, tables, ordered = random_paged_keys(seq_lens, dim, gen)
    q = torch.randn(sum(query_lens), heads, dim, generator=gen)
    w = torch.randn(sum(query_lens), heads, generator=gen)
    positions = torch.tensor(list(range(20, 30)) + list(range(21)))
    got = kernels.indexer_topk_prefill(q, w, cache, tables, seq_lens, query_lens, positions, topk)
    for t, pos in enumerate(positions.tolist()):
        b = 0 if t < 10 else 1
        picked = got[t][got[t] >= 0].tolist()
        assert set(picked) == brute_force_topk(q[t], w[t], ordered[b][: pos + 1], topk)
        assert max(picked) <= pos
    # A sequence's last prefill token and a decode query at the same point pick the same positions.
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    last = torch.tensor([9, 30])
    decode = kernels.indexer_topk_decode(q[last], w[last], cache, tables, lens, 4, topk)
    for row, t in enumerate(last.tolist()):
        assert set(decode[row].tolist()) == set(got[t].tolist())


def indexer_picks(model, tokens, bound, capacity):
    """Run a prompt then 3 decode steps; return each Indexer call's picks as positions, layer by layer
    (the model asks the indexer for cache slots: mapped back here through the one table)."""
    picks = []
    table = list(range(39, 0, -3))
    page_of_block = torch.full((40,), -1, dtype=torch.long)
    page_of_block[table] = torch.arange(len(table))

    def positions(slots):
        pos = page_of_block[slots.clamp(min=0) // BLOCK] * BLOCK + slots.clamp(min=0) % BLOCK
        return torch.where(slots >= 0, pos, -1)

    hooks = [m.register_forward_hook(lambda _m, _a, out: picks.append(positions(out.clone())))
             for m in model.modules() if isinstance(m, Indexer)]
    cache = KVCache(model.config, 40, BLOCK, model.dtype)
    n = len(tokens) - 3
    model(build_batch([tokens[:n]], [0], [table], BLOCK, capacity, bound), cache)
    for i in range(n, len(tokens)):
        model(build_batch([[tokens[i]]], [i], [table], BLOCK, capacity, bound), cache)
    for h in hooks:
        h.remove()
    return picks


def test_model_bounds_pick_the_same_positions():
    model = random_model(CONFIG, seed=11)
    tokens = torch.randint(0, 256, (45,), generator=torch.Generator().manual_seed(4)).tolist()
    actual = indexer_picks(model, tokens, "actual", 100)
    capacity = indexer_picks(model, tokens, "capacity", 100)
    assert len(actual) == len(capacity) == 4 * CONFIG.num_hidden_layers
    for a, c in zip(actual, capacity, strict=True):
        assert torch.equal(a.sort(-1).values, c.sort(-1).values)
    # Decode at length 43..45 with top-12: every row is full, and only past positions.
    for out in actual[-CONFIG.num_hidden_layers :]:
        assert (out >= 0).all() and out.max() < 45 and out.shape == (1, CONFIG.index_topk)


def bmm_input_dims(model, bound, capacity, batch_size=3, cached=20):
    cache = KVCache(model.config, 40, BLOCK, model.dtype)
    tables = [[b * 4 + i for i in range(4)] for b in range(batch_size)]
    tokens = [[1] * cached] * batch_size
    model(build_batch(tokens, [0] * batch_size, tables, BLOCK, capacity, bound), cache)
    batch = build_batch([[2]] * batch_size, [cached] * batch_size, tables, BLOCK, capacity, bound)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        model(batch, cache)
    return [e.input_shapes for e in prof.events() if e.name == "aten::bmm"]


@pytest.mark.parametrize("capacity", [1001, 4096])
def test_capacity_bound_scores_a_capacity_shaped_tensor(capacity):
    model = random_model(CONFIG, seed=0)
    positions = math.ceil(capacity / BLOCK) * BLOCK  # 1008 for 1001
    key_shape = [3, positions, CONFIG.index_head_dim]
    shapes = bmm_input_dims(model, "capacity", capacity)
    assert sum(key_shape in s for s in shapes) == CONFIG.num_hidden_layers
    # The actual bound scores ceil(21 / 8) * 8 = 24 positions, whatever the capacity.
    shapes = bmm_input_dims(model, "actual", capacity)
    assert not any(key_shape in s for s in shapes)
    assert sum([3, 24, CONFIG.index_head_dim] in s for s in shapes) == CONFIG.num_hidden_layers


def test_sparse_mla_ignores_invalid_entries():
    gen = torch.Generator().manual_seed(5)
    heads, rank, rope = 4, 32, 8
    cache = torch.randn(10, BLOCK, rank + rope, generator=gen)
    cache[0] = 1e4  # -1 entries read block 0 before masking: poison it
    q = torch.randn(3, heads, rank + rope, generator=gen)
    slots = torch.tensor([[8, 9, 30, -1, -1, -1], [79, 8, 50, 51, 52, 53], [-1, 20, -1, -1, -1, -1]])
    got = kernels.sparse_mla(q, cache, slots, rank, 0.2)
    rows = cache.view(-1, rank + rope).double()
    for t in range(3):
        valid = slots[t][slots[t] >= 0]
        probs = (q[t].double() @ rows[valid].T * 0.2).softmax(-1)
        torch.testing.assert_close(got[t].double(), probs @ rows[valid, :rank], rtol=1e-5, atol=1e-5)


def test_moe_experts_match_a_per_token_loop():
    gen = torch.Generator().manual_seed(6)
    tokens, hidden, inter, experts, top = 9, 16, 8, 5, 2
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen)
    w2 = torch.randn(experts, hidden, inter, generator=gen)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top] for _ in range(tokens)])
    weights = torch.rand(tokens, top, generator=gen)
    got = kernels.moe_experts(x, ids, weights, w13, w2)
    for t in range(tokens):
        want = torch.zeros(hidden, dtype=torch.float64)
        for e, wt in zip(ids[t].tolist(), weights[t].tolist(), strict=True):
            gate, up = (w13[e].double() @ x[t].double()).chunk(2)
            want += wt * (w2[e].double() @ (torch.nn.functional.silu(gate) * up))
        torch.testing.assert_close(got[t].double(), want, rtol=1e-4, atol=1e-4)
