"""What SUMMARY.md puts first: the answer to the goal where no lever gained, and a Stack a reader checks at a
glance (the raw inventory left whole in results.json)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "campaign"))

from sample_store import populate  # noqa: E402

from rooftop.report.build import build_report  # noqa: E402


def test_the_headline_of_a_run_where_no_lever_gained_says_what_bounds_the_step(tmp_path):
    """The vLLM example's shape: every lever within noise of the baseline, no capacity-sized work. The
    headline was the lever that lost ('PD did not help'); it answers the goal instead, PD beside it."""
    st = populate(tmp_path)
    base = {(r.repeat, r.concurrency): r.summary for r in st.levels("baseline")}
    for variant in ("context-cap", "indexer-actual"):  # the two levers that gained: now the baseline's figures
        for row in st.levels(variant):
            st.put_level(row.series, variant, row.repeat, row.concurrency, base[(row.repeat, row.concurrency)], True)
    trace = next(t for t in st.traces("baseline"))
    st.put_trace("baseline", trace.path, {**trace.analysis, "capacity_findings": []}, trace.concurrency)
    st.close()
    out = build_report(tmp_path)
    summary, plan = out.summary.read_text(), out.plan.read_text()
    head = summary.split("## Stack")[0]
    finding = next(line for line in head.splitlines() if line.startswith("> **Finding:**"))
    assert finding.startswith("> **Finding:** The indexer takes 70% of each decode step (")
    assert "its roofline floor of 2.000 ms" in finding and "× [" in finding
    assert "No lever raised tok/s beyond noise at any level: pd " in finding and "context-cap " in finding
    assert "> **PD:** PD (lever pd: prefill and decode on separate workers) did not help" in head
    assert "| 1 | The indexer bounds the decode step | context |" in summary
    assert "- Top bottleneck: **The indexer bounds the decode step**" in plan
    assert "\n1. Shorten the indexer (70% of the decode step): put a change that does" in plan
    doc = json.loads(out.results.read_text())
    assert doc["findings"][0]["rule"] == "what_bounds" and doc["findings"][0]["numbers"]["share"] == 0.70


INVENTORY = {
    "driver": {"driver_version": "580.159.04", "cuda_driver_version": "13.0"},
    "engine": {"name": "vllm", "version": "0.32.0"},
    "env": {"OMP_NUM_THREADS": "1", "HF_TOKEN": "hf_abc123", "NVIDIA_REQUIRE_CUDA": "cuda>=13.0 " + "brand=x " * 300},
    "gpu_count": 2, "gpu_source": "nvml",
    "gpus": [{"index": i, "name": "NVIDIA H200", "memory_total_mib": 143771, "numa_node": 0,
              "pci_bus_id": f"0000:0{i}:00.0"} for i in range(2)],
    "host": {"cpu_count": 16, "cpu_model": "Intel(R) Xeon(R)", "cpus_online": "0-15", "kernel": "6.18.44"},
    "numa": [{"node": 0, "cpus": "0-7"}, {"node": 1, "cpus": "8-15"}],
    "packages": {"vllm": {"version": "0.32.0"}, "torch": {"version": "2.11.0"}, "transformers": {"version": "5.17.0"},
                 "rooftop": {"version": "0.1.0", "commit": "786cbdb8b024f71d2040a7c30c5ed2206dc211ab", "dirty": True}},
    "processes": [{"role": "single", "name": "single", "pid": 300, "cpus_allowed": "0-15", "gpus": [0, 1],
                   "env": {"DO_NOT_TRACK": "1"}, "expected_cpus": None, "host": None, "tree": {"300": "0-15"}}],
    "python": {"python": "3.12.3", "executable": "/opt/vllm/bin/python"},
    "torch": {"version": "2.11.0", "cuda": "13.0", "git_version": "70d99e9"},
}


def test_the_stack_is_an_inventory_at_a_glance_and_results_json_keeps_it_whole(tmp_path):
    st = populate(tmp_path)
    dep = next(d for d in st.deployments() if d.variant == "baseline")
    st.put_deployment(dep.variant, dep.repeat, dep.levers, dep.spec, INVENTORY, dep.launch_script, dep.placement,
                      dep.url)
    st.close()
    out = build_report(tmp_path)
    summary = out.summary.read_text()
    stack = summary.split("## Stack")[1].split("## Topology")[0]
    placement = summary.split("## Topology and verified placement")[1].split("## Single-node results")[0]
    assert "- **Engine**: vllm 0.32.0\n" in stack and "- **Model**: `tiny`\n" in stack
    assert "- **torch**: 2.11.0 (CUDA 13.0); Python 3.12.3 (`/opt/vllm/bin/python`)\n" in stack
    assert "- **Packages**: transformers 5.17.0, rooftop 0.1.0 at 786cbdb (uncommitted changes)\n" in stack
    assert ("- **Hardware**: 2× NVIDIA H200 (140 GiB), driver 580.159.04 (CUDA 13.0); 16 CPUs (Intel(R) Xeon(R), "
            "online 0-15), 2 NUMA nodes; Linux 6.18.44\n") in stack
    # every variant's roles and their CPUs (and GPUs where the inventory has them), variants alike grouped
    roles = next(line for line in stack.splitlines() if line.startswith("- **CPUs per role**: "))
    assert roles.startswith("- **CPUs per role**: baseline: single 0-1, GPUs 0,1; ")  # CPUs verified, GPUs given
    assert "pd: prefill 0 (pinned), decode 1 (pinned)" in roles and "context-cap, indexer-actual, max-running: single 0-1" in roles
    env = next(line for line in stack.splitlines() if line.startswith("- **Engine environment**: "))
    assert "HF_TOKEN=<redacted>" in env and "OMP_NUM_THREADS=1" in env and "characters; whole in results.json" in env
    # no nested dump: no Python dicts, no None cells
    for text in (stack, placement):
        assert "{'" not in text and '{"' not in text and "None" not in text and "driver: {}" not in text
    assert "| prefill | 100 | 0 | 0 | 1 |" in placement and "| single | 300 | not pinned | 0-1 | 1 |" in placement
    doc = json.loads(out.results.read_text())
    raw = next(d for d in doc["deployments"] if d["variant"] == "baseline" and d["repeat"] == 0)
    assert raw["inventory"]["env"]["NVIDIA_REQUIRE_CUDA"] == INVENTORY["env"]["NVIDIA_REQUIRE_CUDA"]
    assert raw["inventory"]["env"]["HF_TOKEN"] == "<redacted>" and raw["placement"][0]["tree"] == {"300": "0-1"}
    assert "hf_abc123" not in out.results.read_text()
