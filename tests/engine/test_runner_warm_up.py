"""The start-up prefill warm-up writes only the graphs' padding block (run here on the CPU path)."""

import types

import torch

from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.config import ModelConfig
from rooftop.engine.model.weights import random_model
from rooftop.engine.model_runner import ModelRunner, RunnerConfig


def test_warm_up_prefills_touch_only_the_padding_block():
    config = ModelConfig.preset("tiny")
    model = random_model(config, seed=0)
    cache = KVCache(config, 12, 16, torch.float32, "cpu")
    for t in cache.latent + cache.index_k:
        t.normal_(generator=torch.Generator().manual_seed(1))
    before = [t.clone() for t in cache.latent + cache.index_k]
    runner = ModelRunner(model, cache, RunnerConfig(block_size=16, capacity_tokens=1024, cuda_graphs=False),
                         torch.device("cpu"))
    runner.graphs = types.SimpleNamespace(dummy_block=11)  # as DecodeGraphs reserves it on a GPU
    runner.warm_up_prefill()
    assert max(max(c) for c in runner.WARM_UP_CHUNKS) > 16  # chunks longer than a block reuse it
    for old, new in zip(before, cache.latent + cache.index_k, strict=True):
        assert torch.equal(old[:11], new[:11])  # every real block as it was
        assert not torch.equal(old[11], new[11])  # the padding block was written


def test_warm_up_prefills_reach_every_size_of_the_moe_layout_kernel():
    """The one-program MoE layout kernel is compiled for a power of two of the pairs (`ALIGN_TIERS`): the
    warm-up's token counts reach every size a served prefill of up to 512 tokens could ask for, at any
    expert count and top-k here, with the shared expert folded in (up to SHARED_FOLD_MAX_TOKENS) or not."""
    from rooftop.engine.kernels import triton_moe
    from rooftop.engine.model.moe import SHARED_FOLD_MAX_TOKENS

    warm = [sum(chunk) for chunk in ModelRunner.WARM_UP_CHUNKS]
    for experts in (8, 32, 64, 256):
        for top_k in (1, 2, 4, 6, 8):
            for shared, most in ((False, 512), (True, SHARED_FOLD_MAX_TOKENS)):
                def size(tokens, top_k=top_k, shared=shared, experts=experts):
                    layout = triton_moe._layout(tokens, top_k, experts + shared, 16, shared)
                    return (layout.block_p, layout.block_e) if layout.one_program else None

                served = {size(t) for t in range(1, most + 1)} - {None}
                warmed = {size(t) for t in warm if t <= most} - {None}
                assert served <= warmed, (experts, top_k, shared, sorted(served - warmed))
