"""A run store populated with realistic evidence of the demo's story, for store/diagnosis/report tests.

Baseline: capacity-bound indexer (70% of the step, dims 65536 = --context-length); context-cap ~5x
faster; indexer-actual ~4.5x; PD and max-running no different within noise.
"""

from __future__ import annotations

import random
from pathlib import Path

from rooftop.campaign.collect import COMPARISON
from rooftop.campaign.store import Store
from rooftop.campaign.stored_profile import StoredProfile
from rooftop.profile.capacity import CapacityFinding
from rooftop.profile.summary import ComponentTime, ProfileSummary

SPEC_TOML = """
[campaign]
name = "sample"
goal = "find the ceiling of tiny on CPU"
mode = "independent"

[model]
preset = "tiny"

[deployment]
engine = "embedded"
args = { indexer-bound = "capacity", context-length = 65536 }

[bench]
input_len = 32
output_len = 16
concurrency = [1, 4]
requests_per_level = 8
repeats = 3
warmup = 2

[profile]
concurrency = 4
steps = 10

[[lever]]
name = "pd"
hypothesis = "isolating decode from prefill raises tok/s"
topology = "pd"
prefill = { cpus = [0] }
decode = { cpus = [1] }

[[lever]]
name = "context-cap"
hypothesis = "indexer work scales with the allocated context"
args = { context-length = 4096 }
quality_check = true

[[lever]]
name = "indexer-actual"
hypothesis = "scoring only the real length removes the capacity cost"
args = { indexer-bound = "actual" }

[[lever]]
name = "max-running"
hypothesis = "a smaller running batch lowers TPOT"
args = { max-running-requests = 2 }
"""

# variant -> tok/s per concurrency (mean of repeats), TPOT ms at C=1
TOK_S = {"baseline": {1: 10.0, 4: 14.0}, "pd": {1: 10.1, 4: 13.9}, "context-cap": {1: 45.0, 4: 70.0},
         "indexer-actual": {1: 42.0, 4: 63.0}, "max-running": {1: 10.0, 4: 14.1}}
TOPOLOGY = {"pd": "pd"}


def level_summary(c: int, tok_s: float, rng: random.Random) -> dict:
    """One repeat of one level, in the bench summary.json level schema."""
    tpot = 1000.0 * c / tok_s
    ttft = 3 * tpot * rng.uniform(0.95, 1.05)
    return {"concurrency": c, "valid": True, "completed": 8, "failed": 0,
            "output_tok_s": {"mean": tok_s, "ci_low": tok_s, "ci_high": tok_s, "per_repeat": [tok_s]},
            "ttft_ms": {"mean": ttft, "median": ttft, "p90": ttft * 1.2, "p99": ttft * 1.4},
            "tpot_ms": {"mean": tpot * rng.uniform(0.97, 1.03), "median": tpot, "p90": tpot, "p99": tpot}}


def profile_json(indexer_share: float, step_ms: float, capacity: bool) -> dict:
    """A CPU profile as the campaign stores it (a StoredProfile's JSON)."""
    rest = 1.0 - indexer_share
    comps = [("indexer", indexer_share), ("moe", rest * 0.45), ("attention", rest * 0.3),
             ("lm_head", rest * 0.15), ("norm", rest * 0.1)]
    comps.sort(key=lambda c: -c[1])
    findings = [CapacityFinding(dim=65536, derived_from="context-length 65536",
                                ops=["aten::bmm", "aten::relu", "aten::mul", "aten::sum"], component="indexer",
                                path="model.layers.*.indexer", ms_per_step=0.85 * indexer_share * step_ms,
                                share=0.85 * indexer_share)]
    summary = ProfileSummary(
        trace="trace.json.gz", basis="cpu_ops", granularity="module", arch=None, steps=10,
        gpu_busy_ms_per_step=step_ms, gpu_idle_share=0.02, tensor_core_share=0.0,
        components=[ComponentTime(n, f"model.layers.*.{n}", s, s * step_ms, {}) for n, s in comps],
        categories={}, unit_shares={}, capacity_findings=findings if capacity else [], top_kernels=[], notes=[])
    return StoredProfile(summary, "single", measured="the steps as served (eagerly)").to_json_dict()


def populate(run_dir: Path, seed: int = 1, repeats: int = 3, stop_after_blocks: int | None = None,
             pd_fails: bool = False, confidence: float = 0.95) -> Store:
    """Write the sample campaign's store under run_dir (every block, or only the first few)."""
    rng = random.Random(seed)
    store = Store.create(run_dir)
    spec = SPEC_TOML.replace("warmup = 2", f"warmup = 2\nconfidence = {confidence}")
    store.put_run("sample", "find the ceiling of tiny on CPU", "independent", spec, "sample.toml", {"cpus": 2})
    variants = list(TOK_S)
    for lever in variants[1:]:
        store.put_decision(COMPARISON, lever, {"lever": lever, "variant": lever, "base_variant": "baseline",
                                               "series": "main"})
    blocks = 0
    for r in range(repeats):
        order = variants if r % 2 == 0 else variants[::-1]
        for v in order:
            if stop_after_blocks is not None and blocks >= stop_after_blocks:
                return store
            topo = TOPOLOGY.get(v, "single")
            if pd_fails and v == "pd":
                store.start_unit(f"main/pd/r{r}/deploy")
                store.finish_unit(f"main/pd/r{r}/deploy", error="prefill exited with code 2 while starting; "
                                  "last lines of logs/prefill.log:\n    error: --role prefill: not built yet")
                blocks += 1
                continue
            # the keys launch.deployment.verify_placement writes
            placement = ([{"role": "prefill", "name": "prefill", "pid": 100 + r, "cpus_allowed": "0",
                           "expected_cpus": "0", "tree": {str(100 + r): "0"}},
                          {"role": "decode", "name": "decode", "pid": 200 + r, "cpus_allowed": "1",
                           "expected_cpus": "1", "tree": {str(200 + r): "1"}}]
                         if topo == "pd" else [{"role": "single", "name": "single", "pid": 300 + r,
                                                "cpus_allowed": "0-1", "expected_cpus": None,
                                                "tree": {str(300 + r): "0-1"}}])
            store.put_deployment(v, r, [] if v == "baseline" else [v], {"engine": "embedded", "model": "tiny",
                                 "topology": topo}, {"engine": "embedded 0.1.0", "torch": "2.13.0",
                                 "env": {"HF_TOKEN": "hf_abc123", "OMP_NUM_THREADS": "1"}},
                                 f"#!/usr/bin/env bash\nexport HF_TOKEN=hf_abc123\nrooftop serve --preset tiny  # {v}\n",
                                 placement, "http://127.0.0.1:40000")
            for stage in ("deploy", "verify", "warmup"):
                store.start_unit(f"main/{v}/r{r}/{stage}")
                store.finish_unit(f"main/{v}/r{r}/{stage}")
            for c, mean in TOK_S[v].items():
                tok = mean * (1.0, 0.96, 1.04)[r % 3]  # the same drift pattern for every variant
                store.put_level("main", v, r, c, level_summary(c, tok, rng), True)
                store.put_requests("main", v, r, c, [
                    {"index": i, "status": "ok", "decided_ns": 1_000_000 * i, "end_ns": 1_000_000 * i + 5_000_000,
                     "concurrency": c, "repeat": r} for i in range(8)])
            store.start_unit(f"main/{v}/r{r}/sweep")
            store.finish_unit(f"main/{v}/r{r}/sweep")
            if r == 0:
                if v == "baseline":
                    store.put_trace(v, "traces/baseline/trace.json.gz", profile_json(0.70, 280.0, True), 4)
                elif v == "context-cap":
                    store.put_trace(v, "traces/context-cap/trace.json.gz", profile_json(0.08, 57.0, False), 4)
                if v in ("baseline", "context-cap"):
                    store.start_unit(f"main/{v}/r{r}/quality")
                    store.finish_unit(f"main/{v}/r{r}/quality")
                if v == "context-cap":
                    store.put_analysis(v, "quality", {"prompts": 8, "agreement": 1.0, "exact_match": 1.0,
                                                      "mean_kl": 0.0, "kl_positions": 128, "flagged": False,
                                                      "reason": "within thresholds"})
                store.put_analysis(v, "roofline", {"hardware": "cpu (measured 20 GB/s)", "batch": 4,
                                                   "context": 48, "context_capacity": 65536,
                                                   "floor_ms": 2.0, "components": {
                                                       "indexer": 0.01, "moe_routed": 1.0, "attn_core": 0.5,
                                                       "lm_head": 0.49}})
                store.start_unit(f"main/{v}/r{r}/profile")
                store.finish_unit(f"main/{v}/r{r}/profile")
            store.start_unit(f"main/{v}/r{r}/teardown")
            store.finish_unit(f"main/{v}/r{r}/teardown")
            blocks += 1
    return store
