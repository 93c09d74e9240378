"""The embedded engine's step loop with its real model and CUDA graphs, but no HTTP server: requests
go in by `Engine.submit` and their tokens to a sink that only counts. Set beside the served figures
(`engine_serve_gpu.py`), it says how much of the served decode step the HTTP front end costs.

    python3 benchmarks/engine_loop_gpu.py --preset small --concurrency 1,64 --out engine-loop.json

Per level: one wave of `concurrency` requests (random prompts of --input-len tokens, greedy, exactly
--output-len tokens each, as rooftop's bench asks for them), after a warm-up wave. Reports the
engine's own decode-step time (its StepRecord, what /metrics shows) over the steps that ran the
whole batch, and output tokens per second of wall time over the wave.
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


def wave(engine, n: int, input_len: int, output_len: int, seed: int) -> dict:
    rng = random.Random(seed)
    records = []
    engine.step_listeners.append(records.append)
    done, left = threading.Event(), [n]
    lock = threading.Lock()

    def sink(ev) -> None:
        if ev.finish_reason:
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    done.set()

    t0 = time.perf_counter()
    for _ in range(n):
        engine.submit([rng.randrange(256) for _ in range(input_len)],
                      SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True, min_tokens=output_len),
                      [], sink)
    if not done.wait(600):
        raise TimeoutError(f"{left[0]} of {n} requests still running after 600 s")
    wall = time.perf_counter() - t0
    engine.step_listeners.remove(records.append)
    full = [r.seconds * 1e3 for r in records if r.kind == "decode" and r.num_seqs == n]
    device = [r.device_seconds * 1e3 for r in records
              if r.kind == "decode" and r.num_seqs == n and r.device_seconds is not None]
    prefill = [r.seconds * 1e3 for r in records if r.kind == "prefill"]
    return {"concurrency": n, "wall_s": wall, "output_tok_s": n * output_len / wall,
            "decode_steps_full_batch": len(full),
            "decode_step_ms_median": statistics.median(full) if full else None,
            "decode_step_ms_p10_p90": statistics.quantiles(full, n=10)[::8] if len(full) >= 10 else None,
            # the same steps' forward on the device (CUDA events), and the sum of wall over the sum of device
            "decode_forward_device_ms_median": statistics.median(device) if device else None,
            "decode_wall_over_device": sum(full) / sum(device) if device and len(device) == len(full) else None,
            "prefill_steps": len(prefill), "prefill_step_ms_median": statistics.median(prefill) if prefill else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--context-length", type=int, default=65536)
    ap.add_argument("--concurrency", default="1,64")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    cfg = ServeConfig(preset=args.preset, device=args.device, context_length=args.context_length,
                      max_running_requests=max(levels))
    engine = build_engine(cfg)
    engine.start()
    try:
        wave(engine, min(4, max(levels)), args.input_len, args.output_len, seed=0)  # warm-up
        results = [wave(engine, n, args.input_len, args.output_len, seed=n) for n in levels]
    finally:
        engine.stop()
    for r in results:
        dev = r["decode_forward_device_ms_median"]
        print(f"C={r['concurrency']}: {r['output_tok_s']:.0f} tok/s, decode step {r['decode_step_ms_median']:.3f} ms "
              f"(forward on the device {'-' if dev is None else f'{dev:.3f} ms'}) "
              f"({r['decode_steps_full_batch']} full steps), prefill step {r['prefill_step_ms_median']:.2f} ms "
              f"x {r['prefill_steps']}", flush=True)
    info = {"platform": platform.platform(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    with open(args.out, "w") as f:
        json.dump({"provenance": provenance(), "machine": info, "args": vars(args), "levels": results}, f, indent=2)


if __name__ == "__main__":
    main()
