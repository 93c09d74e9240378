"""Speculative decoding in the embedded engine on a GPU, against the same engine without it: greedy tokens
compared one for one, drafts and acceptances from the steps, decode throughput, and which verify steps
replayed a CUDA graph.

    python3 benchmarks/spec_decode_gpu.py --preset small --dtype bfloat16 --concurrency 1,16 --out spec.json

Per configuration (none, then each --speculative-config), one engine built as `rooftop serve` builds it (CUDA
graphs on); per level one warm-up wave, then one wave of `concurrency` requests: half of them text that repeats
itself (n-gram lookup finds drafts there), half random bytes, greedy, exactly --output-len tokens each.
"""

import argparse
import json
import platform
import random
import statistics
import threading
import time

import torch

from rooftop.engine.build import ServeConfig, build_engine
from rooftop.engine.sequence import SamplingParams
from rooftop.provenance import provenance

REPEATING = ["the cat sat on the mat. ", "abc abd abc abd ", "one two three four ", "roof top "]


def prompts(n: int, input_len: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 2 == 0:
            text = (REPEATING[(i // 2) % len(REPEATING)] * input_len).encode()[:input_len - 1]
            out.append([256, *text])
        else:
            out.append([256] + [rng.randrange(32, 127) for _ in range(input_len - 1)])
    return out


def wave(engine, batch: list[list[int]], output_len: int) -> dict:
    records, tokens = [], {i: [] for i in range(len(batch))}
    engine.step_listeners.append(records.append)
    done, left, lock = threading.Event(), [len(batch)], threading.Lock()

    def sink_for(i: int):
        def sink(ev) -> None:
            tokens[i].append(ev.token_id)
            if ev.finish_reason:
                with lock:
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()
        return sink

    t0 = time.perf_counter()
    for i, p in enumerate(batch):
        engine.submit(p, SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True), [], sink_for(i))
    if not done.wait(600):
        raise TimeoutError(f"{left[0]} requests still running after 600 s")
    wall = time.perf_counter() - t0
    engine.step_listeners.remove(records.append)
    decode = [r.seconds * 1e3 for r in records if r.kind == "decode"]
    return {"wall_s": wall, "output_tok_s": len(batch) * output_len / wall, "steps": len(records),
            "decode_steps": len(decode), "decode_step_ms_median": statistics.median(decode) if decode else None,
            "draft_tokens": sum(r.num_draft_tokens for r in records),
            "accepted_tokens": sum(r.num_accepted_tokens for r in records),
            "accepted_per_pos": [sum(x) for x in zip(*[r.num_accepted_tokens_per_pos for r in records
                                                       if r.num_accepted_tokens_per_pos], strict=True)] or None,
            "tokens": [tokens[i] for i in range(len(batch))]}


def graph_hits(engine) -> dict | None:
    """How many verify forwards replayed a graph, counted by wrapping the graphs' run (this script only)."""
    return getattr(engine, "_verify_counts", None)


def count_graph_use(engine) -> None:
    speculator = getattr(engine, "speculator", None)
    if speculator is None or speculator.graphs is None:
        return
    graphs, counts = speculator.graphs, {"graph": 0, "eager": 0}
    run = graphs.run

    def counted(batch, start=None):
        counts["graph" if graphs.graph_tokens(batch) is not None else "eager"] += 1
        return run(batch, start)

    graphs.run = counted
    engine._verify_counts = counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--context-length", type=int, default=4096)
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--specs", default='{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, '
                                       '"prompt_lookup_max": 4};{"method": "mtp", "num_speculative_tokens": 2}')
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    rows = []
    for spec in [None, *args.specs.split(";")]:
        cfg = ServeConfig(preset=args.preset, device=args.device, dtype=args.dtype, context_length=args.context_length,
                          max_running_requests=max(levels), speculative_config=spec)
        t0 = time.perf_counter()
        engine = build_engine(cfg)
        build_s = time.perf_counter() - t0
        count_graph_use(engine)
        engine.start()
        try:
            for n in levels:
                wave(engine, prompts(n, args.input_len, seed=1), 8)
                got = wave(engine, prompts(n, args.input_len, seed=2), args.output_len)
                rows.append({"spec": spec, "concurrency": n, "build_s": build_s, **got,
                             "verify_forwards": dict(graph_hits(engine) or {})})
        finally:
            engine.stop()
        del engine
        if args.device == "cuda":
            torch.cuda.empty_cache()
    base = {r["concurrency"]: r["tokens"] for r in rows if r["spec"] is None}
    print(f"{'spec':<12} {'C':>3} {'tok/s':>8} {'step ms':>8} {'drafts':>7} {'accepted':>8} {'same tokens':>12} "
          f"{'first diff':>10}  verify forwards")
    for r in rows:
        ref = base[r["concurrency"]]
        pairs = [(a, b) for x, y in zip(ref, r["tokens"], strict=True) for a, b in zip(x, y, strict=True)]
        r["same_token_fraction"] = sum(a == b for a, b in pairs) / len(pairs)
        r["identical_requests"] = sum(x == y for x, y in zip(ref, r["tokens"], strict=True))
        firsts = [next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), None)
                  for x, y in zip(ref, r["tokens"], strict=True)]
        r["first_divergence"] = min((f for f in firsts if f is not None), default=None)
        method = json.loads(r["spec"])["method"] if r["spec"] else "none"
        step = r["decode_step_ms_median"]
        print(f"{method:<12} {r['concurrency']:>3} {r['output_tok_s']:>8.1f} {step if step else 0:>8.2f} "
              f"{r['draft_tokens']:>7} {r['accepted_tokens']:>8} {r['identical_requests']:>5}/{len(ref):<6} "
              f"{str(r['first_divergence']):>10}  {r['verify_forwards']}")
        del r["tokens"]
    with open(args.out, "w") as f:
        json.dump({"provenance": provenance(), "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None, "python": platform.python_version(),
                   "args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
