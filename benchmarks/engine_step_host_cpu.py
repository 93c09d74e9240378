"""Host cost of the embedded engine's step loop per decode step, the model replaced by a stub that
returns logits at once: scheduling, batch building and sampling, no model, no HTTP. (The step time
is the engine's StepRecord, taken before the step's tokens are handed out; the wall time per step,
printed too, includes that hand-out.)

    python3 benchmarks/engine_step_host_cpu.py [--concurrency 64] [--context-length 65536] [--output-len 200]

Runs on the CPU. The step time is the engine's own StepRecord (what its /metrics histogram reports),
median over the decode steps that ran the full batch.
"""

import argparse
import json
import os
import platform
import statistics
import threading
import time

import torch
from torch import nn

from rooftop.engine.engine import Engine
from rooftop.engine.kv.block_manager import blocks_for
from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.config import ModelConfig
from rooftop.engine.sequence import SamplingParams
from rooftop.provenance import provenance


class InstantModel(nn.Module):
    """Logits of zeros for each sequence: the step loop without a model."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, batch, cache):
        return torch.zeros(batch.num_seqs, self.vocab_size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--context-length", type=int, default=65536)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=200)
    ap.add_argument("--no-min-tokens", action="store_true",
                    help="ignore_eos only; by default min_tokens = output length too, as rooftop's bench sends "
                         "(the sampler then bans the end-of-sequence id in every row of every step)")
    args = ap.parse_args()
    config = ModelConfig.preset("small")  # its vocabulary; the cache's layout does not matter here
    block = 64
    per_seq = blocks_for(args.input_len + args.output_len, block)
    blocks = max(blocks_for(args.context_length, block), args.concurrency * per_seq) + 1
    cache = KVCache(ModelConfig.preset("tiny"), blocks, block, torch.float32, "cpu")
    engine = Engine(InstantModel(config.vocab_size), cache, args.context_length, indexer_bound="actual",
                    max_running_requests=args.concurrency, cuda_graphs=False)
    records = []
    engine.step_listeners.append(records.append)
    done, left = threading.Event(), [args.concurrency]

    def sink(ev) -> None:
        if ev.finish_reason:
            left[0] -= 1
            if left[0] == 0:
                done.set()

    engine.start()
    t0 = time.perf_counter()
    for _ in range(args.concurrency):
        engine.submit(list(range(1, args.input_len + 1)),
                      SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True,
                                     min_tokens=0 if args.no_min_tokens else args.output_len), [], sink)
    finished = done.wait(300)
    wall = time.perf_counter() - t0
    engine.stop()
    full = [r.seconds * 1e3 for r in records if r.kind == "decode" and r.num_seqs == args.concurrency]
    result = {"provenance": provenance(), "machine": platform.node(), "cpus": len(os.sched_getaffinity(0)),
              "torch": torch.__version__, "args": vars(args), "finished": finished, "wall_s": wall,
              "full_decode_steps": len(full),
              "wall_ms_per_step": wall / max(1, len(records)) * 1e3,
              "host_ms_per_decode_step_median": statistics.median(full) if full else None}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
