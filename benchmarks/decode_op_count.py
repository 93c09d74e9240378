"""Kernels one decode step launches, counted on the CPU: the torch reference path against the Triton
path (run in Triton's interpreter). On a GPU each op is at least one kernel launch (~2-4 us in a
CUDA graph), so at decode batch sizes the count is a floor on step time that no kernel speed-up moves.

    TRITON_INTERPRET=1 python3 benchmarks/decode_op_count.py [--preset tiny] [--batch 4] [--out ops.json]

Counts aten ops that run a kernel (views, allocations and no-op casts excluded) and Triton launches.
"""

import argparse
import collections
import json
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rooftop.provenance import provenance

# Ops that only make views or allocate: no kernel on a GPU.
NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "slice", "select", "split",
    "split_with_sizes", "chunk", "unsqueeze", "squeeze", "as_strided", "alias", "detach", "unbind", "lift_fresh",
    "_reshape_alias", "unflatten", "narrow", "view_as", "empty", "new_empty", "empty_like", "empty_strided",
    "set_", "result_type",
}


class OpCounter(TorchDispatchMode):
    """Counts aten ops that launch a kernel, outside Triton's interpreter (which runs on torch tensors)."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in NO_KERNEL or _inside_triton():
            return out
        if name in ("to", "_to_copy", "clone", "contiguous") and out is (args[0] if args else None):
            return out  # a cast to the same dtype returns its input: no kernel
        self.ops[name] += 1
        return out


def _inside_triton() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if "triton/runtime" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def count_step(mode: str, preset: str, batch: int) -> dict:
    """Ops and Triton launches of one decode step of `preset` at `batch` in kernel mode `mode`."""
    from triton.runtime import interpreter

    from rooftop.engine.kv.cache import KVCache
    from rooftop.engine.model.batch import build_batch
    from rooftop.engine.model.config import ModelConfig
    from rooftop.engine.model.weights import random_model

    config = ModelConfig.preset(preset)
    model = random_model(config, seed=0)
    cache = KVCache(config, 4 * batch + 1, 16, torch.float32, "cpu")
    tables = [[b * 4 + j for j in range(4)] for b in range(batch)]
    step = build_batch([[65 + b] for b in range(batch)], [40] * batch, tables, 16, 1024, "actual", "cpu")
    os.environ["ROOFTOP_KERNELS"] = mode
    model(step, cache)  # warm-up
    launches: collections.Counter = collections.Counter()
    original = interpreter.GridExecutor.__call__

    def counted(self, *args, **kwargs):
        launches[self.fn.__name__] += 1
        return original(self, *args, **kwargs)

    interpreter.GridExecutor.__call__ = counted
    try:
        with OpCounter() as counter:
            model(step, cache)
    finally:
        interpreter.GridExecutor.__call__ = original
    torch_ops, triton_ops = sum(counter.ops.values()), sum(launches.values())
    return {"mode": mode, "preset": preset, "batch": batch, "layers": config.num_hidden_layers,
            "torch_ops": torch_ops, "triton_launches": triton_ops, "kernels": torch_ops + triton_ops,
            "kernels_per_layer": (torch_ops + triton_ops) / config.num_hidden_layers,
            "by_op": dict(counter.ops.most_common()), "by_triton_kernel": dict(launches.most_common())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--out", default="decode-op-count.json")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("set TRITON_INTERPRET=1 (before Python starts): the Triton path runs in its interpreter here")
    from rooftop.engine.kernels.interpreter import patch_numpy_index

    patch_numpy_index()
    rows = [count_step(mode, args.preset, args.batch) for mode in ("reference", "triton")]
    for r in rows:
        print(f"{r['mode']:9s}: {r['kernels']} kernels a decode step ({r['torch_ops']} torch ops + "
              f"{r['triton_launches']} Triton launches), {r['kernels_per_layer']:.1f} a layer")
    with open(args.out, "w") as f:
        json.dump({"provenance": provenance(), "command": " ".join(sys.argv), "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
