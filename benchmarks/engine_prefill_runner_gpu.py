"""One prefill step through ModelRunner.run, as the engine takes it (batch build, forward, sampling),
with and without CUDA graphs.

    python3 benchmarks/engine_prefill_runner_gpu.py 1     # graphs on (decode and prefill graphs)
    python3 benchmarks/engine_prefill_runner_gpu.py 0     # eager

`small` preset, one sequence of 64, 256 or 512 new tokens, context length 65536. Median and min ms of
10 steps after 3 warm-ups, each step ended by a device sync (sampling reads its tokens anyway).
The timer is engine_prefill_gpu.py's.
"""

import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_prefill_gpu import wall_ms  # noqa: E402  (a sibling script: one timer for both)

from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.config import ModelConfig
from rooftop.engine.model.weights import random_model
from rooftop.engine.model_runner import ModelRunner, RunnerConfig
from rooftop.engine.sequence import SamplingParams, Sequence

BLOCK = 64


def main() -> None:
    graphs = len(sys.argv) > 1 and sys.argv[1] == "1"
    config = ModelConfig.preset("small")
    model = random_model(config, seed=0, device="cuda")
    cache = KVCache(config, 2000, BLOCK, torch.bfloat16, "cuda")
    t0 = time.time()
    runner = ModelRunner(model, cache, RunnerConfig(BLOCK, 65536, "actual", graphs, 64), torch.device("cuda"))
    print(f"runner ready in {time.time() - t0:.1f} s; graphs {graphs}, prefill graphs "
          f"{getattr(runner, 'prefill_graphs', None) is not None}")
    for chunk in (64, 256, 512):
        def step(chunk=chunk):
            seq = Sequence([(7 * i + 65) % 256 for i in range(chunk)], SamplingParams(max_tokens=4))
            seq.block_table = list(range(math.ceil(chunk / BLOCK)))
            seq.num_scheduled_tokens = chunk
            return runner.run([seq], True)
        median, times = wall_ms(step, 10)
        print(f"prefill step of {chunk} tokens: {median:.2f} ms median, {min(times):.2f} min")


if __name__ == "__main__":
    main()
