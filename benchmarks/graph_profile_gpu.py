"""A held-out case for attribution through CUDA graphs (issue 15): the embedded engine's decode step with a
capacity-bound indexer, profiled as graph replays and eagerly, against the truth measured by timing each
part on its own. GPU only.

    python3 benchmarks/graph_profile_gpu.py --preset small --context 1024 --capacity 262144 --batch 16 \\
        --out $OUT [--ncu]

- truth: every module where the component changes (the indexer inside attention, MoE, dense MLP, norms,
  embedding, lm_head) is captured alone in a CUDA graph with the inputs it had in one eager step and
  timed by replay (median of --iters, CUDA events); a part's own time is its graph's minus the parts
  nested in it; shares are of the whole step's graph replay (the rest is glue between parts).
- traces: --steps graph replays and --steps eager steps, each in a `decode_step` range, profiled with
  shapes, stacks and modules (graph.json.gz, eager.json.gz).
- rooftop: the graph trace alone, and through the eager map; shares against the truth, capacity findings.
- --ncu: Nsight Compute on the graph trace's top kernels while this script replays the graph
  (`--ncu-child`), each kernel on the H200's roofline (ncu.json).
"""

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from kernels_gpu import replay_times_ms  # this folder's (run as a script)

from rooftop.engine.cuda_graphs import DecodeGraphs
from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.batch import build_batch
from rooftop.engine.model.config import ModelConfig
from rooftop.engine.model.weights import random_model
from rooftop.profile.components import component_of
from rooftop.provenance import provenance

DEV = "cuda"
BLOCK = 64


def setup(args):
    """Model, cache, graphs and a capacity-bound decode batch of args.batch sequences of args.context tokens."""
    config = ModelConfig.preset(args.preset)
    model = random_model(config, seed=0, device=DEV)
    pages = math.ceil(args.context / BLOCK)
    cache = KVCache(config, args.batch * pages + 1, BLOCK, torch.bfloat16, DEV)
    for t in cache.latent + cache.index_k:
        t.normal_()
    # the graph runs the capacity-bound indexer too: graph and eager steps do the same work
    graphs = DecodeGraphs(model, cache, [args.batch], max_pages=math.ceil(args.capacity / BLOCK),
                          dummy_block=cache.num_blocks - 1, indexer_bound="capacity")
    tables = [[b * pages + j for j in range(pages)] for b in range(args.batch)]
    new = [[(7 * b + 65) % 256] for b in range(args.batch)]
    batch = build_batch(new, [args.context - 1] * args.batch, tables, BLOCK, args.capacity, "capacity", DEV)
    return config, model, cache, graphs, batch


def replay_ms(fn, iters: int) -> float:
    """Median ms of fn() over `iters`, CUDA events, after 3 warm-ups."""
    return statistics.median(replay_times_ms(fn, iters, warmup=3))


def graphed(fn):
    """fn captured in a CUDA graph; the replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def part_times(model, cache, batch, iters: int) -> tuple[dict[str, float], list[dict]]:
    """Each component's own time in one decode step, timed part by part (see the module doc)."""
    paths = {"": (type(model).__name__,)}
    for name, mod in model.named_modules():
        if name:
            parent = name.rsplit(".", 1)[0] if "." in name else ""
            paths[name] = paths[parent] + (type(mod).__name__,)
    comp = {name: component_of(path) for name, path in paths.items()}
    boundaries = {}
    for name, mod in model.named_modules():
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        if name and comp[name] not in ("other", "runtime") and comp[name] != comp[parent]:
            boundaries[name] = mod
    calls, hooks = {}, []
    for name, mod in boundaries.items():
        def pre(module, args, kwargs, name=name):
            calls.setdefault(name, (args, kwargs))
        hooks.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
    with torch.inference_mode():
        model(batch, cache)
    for h in hooks:
        h.remove()
    torch.cuda.synchronize()
    own_ms, rows = {}, []
    with torch.inference_mode():
        for name, (args, kwargs) in calls.items():
            mod = boundaries[name]
            try:
                ms = replay_ms(graphed(lambda mod=mod, a=args, k=kwargs: mod(*a, **k)), iters)
            except Exception as exc:  # a part that cannot run alone is reported, not fatal
                rows.append({"module": name, "component": comp[name], "error": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            own_ms[name] = ms
            rows.append({"module": name, "component": comp[name], "ms": ms})
    per_component: dict[str, float] = {}
    for name, ms in own_ms.items():
        nested = sum(v for other, v in own_ms.items() if other.startswith(name + "."))
        per_component[comp[name]] = per_component.get(comp[name], 0.0) + ms - nested
    return per_component, rows


def profile_to(path: Path, fn, steps: int) -> Path:
    from torch.profiler import ProfilerActivity, profile, record_function

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, with_stack=True,
                 with_modules=True) as prof:
        for _ in range(steps):
            with record_function("decode_step"):
                fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--capacity", type=int, default=262144)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ncu", action="store_true", help="also run Nsight Compute on the top kernels")
    ap.add_argument("--ncu-child", action="store_true", help=argparse.SUPPRESS)  # what ncu runs
    args = ap.parse_args()
    out = Path(args.out)
    t0 = time.time()
    config, model, cache, graphs, batch = setup(args)
    step = lambda: graphs.run(batch)  # noqa: E731
    if args.ncu_child:  # ncu profiles only inside the NVTX range: the steps, not the set-up
        torch.cuda.synchronize()
        for _ in range(2):
            torch.cuda.nvtx.range_push("decode_step")
            step()
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        return
    with torch.inference_mode():
        step_ms = replay_ms(step, args.iters)
        eager_ms = replay_ms(lambda: model(batch, cache), max(3, args.iters // 4))
    comps, rows = part_times(model, cache, batch, args.iters)
    truth = {k: v / step_ms for k, v in sorted(comps.items(), key=lambda kv: -kv[1])}
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "preset": args.preset,
              "batch": args.batch, "context": args.context, "capacity": args.capacity, "command": " ".join(sys.argv),
              "graph_step_ms": step_ms, "eager_step_ms": eager_ms, "truth_ms": comps, "truth_share": truth,
              "truth_glue_share": 1 - sum(truth.values()), "parts": rows}
    print(f"graph step {step_ms:.3f} ms, eager {eager_ms:.3f} ms; truth shares "
          + ", ".join(f"{k} {v:.1%}" for k, v in truth.items()), flush=True)
    with torch.inference_mode():
        gpath = profile_to(out / "graph.json.gz", step, args.steps)
        epath = profile_to(out / "eager.json.gz", lambda: model(batch, cache), args.steps)
    from rooftop.profile import analyze, load_trace
    from rooftop.profile.kernel_code import default_dirs

    gtrace, etrace = load_trace(gpath), load_trace(epath)
    alone = analyze(gtrace, context_length=args.capacity, kernel_code=default_dirs())
    mapped = analyze(gtrace, context_length=args.capacity, eager_map=etrace, kernel_code=default_dirs(), top=25)
    eager = analyze(etrace, context_length=args.capacity, kernel_code=default_dirs())
    for name, s in (("graph_alone", alone), ("graph_mapped", mapped), ("eager", eager)):
        result[name] = s.to_json_dict()
        print(f"{name}: " + ", ".join(f"{c.name} {c.share:.1%}" for c in s.components[:8])
              + f"; capacity {[(f.dim, f.component, round(f.ms_per_step, 3)) for f in s.capacity_findings]}"
              + f"; unknown unit {s.unit_shares.get('unknown', 0.0):.1%}", flush=True)
    mapped_share = {c.name: c.share for c in mapped.components}
    # the truth's glue (time between parts) has no module: it is the trace's "other"/"runtime"
    result["share_error_points"] = {k: 100 * (mapped_share.get(k, 0.0) - v) for k, v in truth.items()}
    print("mapped - truth, points: " + ", ".join(f"{k} {v:+.1f}" for k, v in result["share_error_points"].items()))
    if args.ncu:
        from rooftop.hardware.specs import gpu_spec
        from rooftop.profile import ncu

        names = [k.name for k in mapped.top_kernels[:10]]
        try:
            report = ncu.run_ncu([sys.executable, __file__, *sys.argv[1:], "--ncu-child"], names, out / "ncu",
                                 launches=400, timeout_s=420, nvtx_range="decode_step")
            table = ncu.kernel_table(ncu.read_report(report), gpu_spec("h200"))
            result["ncu"] = [k.row() for k in table]
            result["ncu_raw"] = ncu.read_report(report)
            for k in table:
                print(f"ncu {k.name[:50]:50s} {k.launches:4d} {k.time_us:8.1f} us {k.dram_gb_s:7.0f} GB/s "
                      f"{k.tflop_s:7.2f} TF/s pipe {k.tensor_pipe_pct} {k.bound} {k.pct_of_bound:.1f}%", flush=True)
        except Exception as exc:  # the profile and truth above are kept whatever ncu does
            result["ncu_error"] = f"{type(exc).__name__}: {exc}"[:2000]
            print(result["ncu_error"])
    result["wall_s"] = time.time() - t0
    (out / "graph-profile.json").write_text(json.dumps({"provenance": provenance(), **result}, indent=1, default=str))
    print(f"wrote {out / 'graph-profile.json'} in {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
