"""The paged, chunked, batched forward against the float64 reference forward."""

import random

import pytest
import torch

from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.batch import build_batch
from rooftop.engine.model.config import ModelConfig
from rooftop.engine.model.reference import reference_greedy, reference_logits
from rooftop.engine.model.weights import random_model

# Smaller than `tiny` so the float64 reference is quick; top-k well below the lengths used.
CONFIG = ModelConfig(
    hidden_size=64, num_hidden_layers=3, first_k_dense_replace=1, intermediate_size=96,
    moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, num_attention_heads=2,
    q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    index_n_heads=8, index_head_dim=16, index_topk=12,
)
BLOCK = 8
TOL = 1e-4


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: these ops are tiny, and on a busy 2-core box threads mostly wait on each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model():
    return random_model(CONFIG, seed=7)


def run_paged(model, tokens, steps, bound="actual", capacity=256, num_blocks=64, seed=0):
    """Run `steps` (each a list of (seq, new token count)) over shuffled blocks; logits by (seq, pos)."""
    cache = KVCache(model.config, num_blocks, BLOCK, model.dtype)
    blocks = list(range(num_blocks))
    random.Random(seed).shuffle(blocks)
    per_seq = -(-max(len(t) for t in tokens) // BLOCK)
    tables = [blocks[i * per_seq : (i + 1) * per_seq] for i in range(len(tokens))]
    cached = [0] * len(tokens)
    out = {}
    for step in steps:
        seqs = [s for s, _ in step]
        new = [tokens[s][cached[s] : cached[s] + n] for s, n in step]
        batch = build_batch(new, [cached[s] for s in seqs], [tables[s] for s in seqs], BLOCK, capacity, bound)
        logits = model(batch, cache)
        for row, (s, n) in enumerate(step):
            cached[s] += n
            out[s, cached[s] - 1] = logits[row]
    return out


def prefill_then_decode(seq, lengths, chunks):
    """One sequence: prompt in `chunks`, then one token at a time to its full length."""
    steps = [[(seq, n)] for n in chunks]
    steps += [[(seq, 1)] for _ in range(lengths - sum(chunks))]
    return steps


@pytest.mark.parametrize("bound", ["actual", "capacity"])
def test_chunked_prefill_and_decode_match_reference(model, bound):
    tokens = torch.randint(0, 256, (1, 60), generator=torch.Generator().manual_seed(1)).tolist()
    ref = reference_logits(model, tokens[0])
    out = run_paged(model, tokens, prefill_then_decode(0, 60, [17, 20, 9]), bound=bound)
    assert len(out) == 3 + 14
    for (_, pos), logits in out.items():
        torch.testing.assert_close(logits.double(), ref[pos], rtol=TOL, atol=TOL)
    # The check has teeth: the argmax follows the logits, and a neighbour position differs.
    assert not torch.allclose(out[0, 59].double(), ref[58], atol=1e-2)


def test_indexer_selection_changes_the_output(model):
    tokens = torch.randint(0, 256, (50,), generator=torch.Generator().manual_seed(2)).tolist()
    sparse = reference_logits(model, tokens)
    dense_model = random_model(ModelConfig(**{**CONFIG.to_dict(), "index_topk": 1000}), seed=7)
    dense = reference_logits(dense_model, tokens)
    # Identical until a position has more than top-k predecessors, different after.
    torch.testing.assert_close(sparse[: CONFIG.index_topk], dense[: CONFIG.index_topk])
    text = torch.isfinite(sparse[-1])  # ids outside the text mask are -inf in both
    assert (sparse[-1] - dense[-1])[text].abs().max() > 1e-3
    paged = run_paged(dense_model, [tokens], [[(0, 50)]])
    torch.testing.assert_close(paged[0, 49].double(), dense[49], rtol=TOL, atol=TOL)


@pytest.mark.parametrize("bound", ["actual", "capacity"])
def test_batch_equals_each_sequence_alone(model, bound):
    gen = torch.Generator().manual_seed(3)
    lengths = [40, 23, 31]
    prompts = [25, 9, 16]
    tokens = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in lengths]
    # Together: prompts in two mixed prefill steps, then decode steps over whoever is still going.
    steps = [[(0, 12), (1, 9), (2, 16)], [(0, 13)]]
    done = list(prompts)
    while any(d < n for d, n in zip(done, lengths, strict=True)):
        step = [(s, 1) for s in range(3) if done[s] < lengths[s]]
        for s, _ in step:
            done[s] += 1
        steps.append(step)
    together = run_paged(model, tokens, steps, bound=bound, seed=4)
    for s in range(3):
        alone = run_paged(model, [tokens[s]], prefill_then_decode(0, lengths[s], [prompts[s]]), bound, seed=5)
        ref = reference_logits(model, tokens[s])
        for (_, pos), logits in alone.items():
            torch.testing.assert_close(together[s, pos], logits, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(logits.double(), ref[pos], rtol=TOL, atol=TOL)


def test_cache_holds_rotated_latent_rows_at_slot_mapping(model):
    tokens = list(range(10, 30))
    cache = KVCache(model.config, 8, BLOCK, model.dtype)
    batch = build_batch([tokens], [0], [[6, 2, 4]], BLOCK, 256)
    model(batch, cache)
    width = CONFIG.kv_lora_rank + CONFIG.qk_rope_head_dim
    assert cache.latent[0].shape == (8, BLOCK, width)
    written = cache.latent[0].view(-1, width)[batch.slot_mapping]
    assert written.abs().sum(-1).gt(0).all()
    untouched = torch.ones(8 * BLOCK, dtype=torch.bool)
    untouched[batch.slot_mapping] = False
    assert cache.latent[0].view(-1, width)[untouched].abs().sum() == 0
    assert cache.index_k[2].view(-1, CONFIG.index_head_dim)[batch.slot_mapping].abs().sum(-1).gt(0).all()
    # The latent part is RMS-normed (unit weight): mean square 1.
    ms = written[:, : CONFIG.kv_lora_rank].pow(2).mean(-1)
    torch.testing.assert_close(ms, torch.ones_like(ms), rtol=1e-4, atol=1e-4)


def test_paged_greedy_decoding_matches_reference_greedy(model):
    prompt = [256, *b"the roof is "]
    want = reference_greedy(model, prompt, 10)
    cache = KVCache(model.config, 16, BLOCK, model.dtype)
    table = [9, 3, 14]
    got, ids = [], list(prompt)
    logits = model(build_batch([ids], [0], [table], BLOCK, 64, "capacity"), cache)
    for _ in range(10):
        got.append(int(logits[0].argmax()))
        ids.append(got[-1])
        logits = model(build_batch([[ids[-1]]], [len(ids) - 1], [table], BLOCK, 64, "capacity"), cache)
    assert got == want
    assert len(set(got)) > 1  # not a degenerate constant output
