"""The start-up prefill warm-up writes only the graphs' padding block (run here on the CPU path)."""

import types

import torch

from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.config import ModelConfig
from rooftop.engine.model.weights import random_model
from rooftop.engine.runner import ModelRunner, RunnerConfig


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
