"""Where the embedded engine's step loop spends its host time at C=1: phase timers around the loop's
calls (Engine._launch / _complete, the runner's batch build and pending-token gather, the graph's
copy-in and replay, the sampler's launch, the wait for the picks), then a cProfile of the loop thread.

    python3 benchmarks/engine_loop_host_gpu.py --preset small --out DIR

In-process engine (no HTTP front end, no engine process), greedy requests of --input-len prompt
tokens and exactly --output-len tokens, one at a time. Writes DIR/loop-host.json (µs a call of each
phase, both runs) and DIR/loop-host-cprofile.txt. The timers cost ~1 µs a call; cProfile inflates
Python time about 1.4x, so its run is for the ranking, the timers' for the figures.
"""

import argparse
import cProfile
import io
import json
import platform
import pstats
import threading
import time
from collections import defaultdict
from pathlib import Path

import torch
from engine_loop_gpu import wave  # this folder's (run as a script)

from rooftop.engine import cuda_graphs
from rooftop.engine import engine as engine_mod
from rooftop.engine import model_runner as runner_mod
from rooftop.engine import sampler as sampler_mod
from rooftop.engine.build import ServeConfig, build_engine
from rooftop.provenance import provenance

PHASES = [
    (engine_mod.Engine, "_drain_inbox", "drain inbox"),
    (engine_mod.Engine, "_launch", "launch (schedule, run, postprocess)"),
    (runner_mod.ModelRunner, "build", "  runner.build (batch tensors)"),
    (runner_mod.ModelRunner, "_gather_pending", "  runner._gather_pending"),
    (cuda_graphs.DecodeGraphs, "run", "  DecodeGraphs.run (copy in, replay)"),
    (cuda_graphs.DecodeGraphs, "_copy_in", "    DecodeGraphs._copy_in"),
    (sampler_mod.Sampler, "__call__", "  sampler launch"),
    (engine_mod.Engine, "_complete", "complete (wait, deliver)"),
    (sampler_mod.PendingSample, "result", "  PendingSample.result (GPU wait, tolist)"),
    (engine_mod.Engine, "_deliver", "  deliver"),
]


class Timers:
    def __init__(self):
        self.total, self.calls = defaultdict(float), defaultdict(int)
        for owner, name, label in PHASES:
            self._wrap(owner, name, label)

    def _wrap(self, owner, name, label) -> None:
        fn = getattr(owner, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total[label] += time.perf_counter() - t
                self.calls[label] += 1

        setattr(owner, name, timed)

    def table(self) -> dict:
        return {label: {"us_per_call": 1e6 * self.total[label] / self.calls[label], "calls": self.calls[label]}
                for _, _, label in PHASES if self.calls[label]}


def one_at_a_time(engine, requests: int, input_len: int, output_len: int, seed: int) -> None:
    """`requests` waves of one request each (`engine_loop_gpu.wave`)."""
    for i in range(requests):
        wave(engine, 1, input_len, output_len, seed=seed * 1_000_003 + i)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--context-length", type=int, default=65536)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timers = Timers()
    engine = build_engine(ServeConfig(preset=args.preset, device=args.device, context_length=args.context_length,
                                      max_running_requests=1))
    records: list = []
    engine.step_listeners.append(records.append)
    profile, profiling = cProfile.Profile(), threading.Event()

    def profiled_loop():  # the loop's body, with cProfile on while `profiling` is set
        while not engine._stopping.is_set():
            if profiling.is_set():
                profile.enable()
            try:
                engine._iterate()
            finally:
                profile.disable()

    engine._thread = threading.Thread(target=profiled_loop, daemon=True)
    engine.start()
    results = {}
    try:
        one_at_a_time(engine, 2, args.input_len, args.output_len, seed=0)  # warm-up
        for run in ("timers", "cprofile"):
            timers.total.clear()
            timers.calls.clear()
            records.clear()
            if run == "cprofile":
                profiling.set()
            t0 = time.perf_counter()
            one_at_a_time(engine, args.requests, args.input_len, args.output_len, seed=1)
            wall = time.perf_counter() - t0
            profiling.clear()
            decode = [r for r in records if r.kind == "decode"]
            device = [r.device_seconds for r in decode if r.device_seconds is not None]
            results[run] = {
                "wall_s": wall, "decode_steps": len(decode),
                "decode_step_ms_mean": 1e3 * sum(r.seconds for r in decode) / len(decode),
                "decode_forward_device_ms_mean": 1e3 * sum(device) / len(device) if device else None,
                "phases": timers.table(),
            }
    finally:
        engine.stop()
    for run, res in results.items():
        print(f"{run}: decode step {res['decode_step_ms_mean']:.3f} ms, forward on the device "
              f"{res['decode_forward_device_ms_mean'] or float('nan'):.3f} ms over {res['decode_steps']} steps")
        for label, row in res["phases"].items():
            print(f"  {label:45s} {row['us_per_call']:8.1f} us x {row['calls']}")
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("tottime").print_stats(45)
    stats.sort_stats("cumulative").print_stats(60)
    (out / "loop-host-cprofile.txt").write_text(text.getvalue())
    info = {"platform": platform.platform(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    (out / "loop-host.json").write_text(json.dumps({"provenance": provenance(), "machine": info, "args": vars(args),
                                                          "runs": results}, indent=2))


if __name__ == "__main__":
    main()
