"""A campaign's [workload] on the real embedded engine: a Mooncake-format trace replayed on its own clock, and a
prefix-caching lever; SUMMARY names the workload, the reuse the trace promises and each variant's hit rate."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rooftop.campaign.store import Store
from rooftop.report import summary_md

# 6 requests of 1,024 tokens (two 512-token blocks), 0.4 s apart: the first block is shared by all, so 5 of the 12
# blocks were seen before — 5 x 512 / 6,144 prompt tokens = 41.7% expected reuse.
TRACE = [{"timestamp": 400 * i, "input_length": 1024, "output_length": 3, "hash_ids": [1, 100 + i]} for i in range(6)]
EXPECTED = 5 * 512 / (6 * 1024)

CAMPAIGN = """
[campaign]
name = "replay"
goal = "what the prefix cache gives a trace that shares its first block"
[model]
preset = "tiny"
[deployment]
engine = "embedded"
args = {{ indexer-bound = "actual", context-length = 2048 }}
[workload]
dataset = "mooncake"
dataset_path = "{trace}"
[bench]
repeats = 1
warmup = 1
timeout_s = 120
[profile]
enabled = false
concurrency = 2
[[lever]]
name = "no-prefix-cache"
hypothesis = "the shared block is prefilled again without the cache"
prefix_caching = false
"""


@pytest.mark.timeout(600)
def test_a_trace_replay_campaign_states_its_workload_and_hit_rates(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    spec = tmp_path / "c.toml"
    spec.write_text(CAMPAIGN.format(trace=trace))
    out = subprocess.run([sys.executable, "-m", "rooftop", "run", str(spec), "--runs-dir", str(tmp_path / "runs")],
                         capture_output=True, text=True, timeout=500)
    assert out.returncode == 0, out.stderr
    run_dir = Path(out.stdout.strip().splitlines()[-1])

    st = Store.open(run_dir)
    rows = {r.variant: r for r in st.levels()}
    assert sorted(rows) == ["baseline", "no-prefix-cache"]
    for row in rows.values():  # the trace's one level, stored under its place in the sweep (0 is the warm-up's)
        assert (row.concurrency, row.summary["label"], row.summary["completed"]) == (1, "trace mooncake", 6)
    on = rows["baseline"].summary["engine_server"]["prefix_cache_hit_rate"]
    assert 0 < on["mean"] <= EXPECTED + 0.05 and on["count"] >= 6 * 1024  # prompt tokens looked up
    off = (rows["no-prefix-cache"].summary.get("engine_server") or {}).get("prefix_cache_hit_rate")
    assert off is None or (off["mean"], off["count"]) == (0.0, 0)  # nothing looked up: the cache is off
    launch = {d.variant: d.launch_script for d in st.deployments()}
    assert "--no-enable-prefix-caching" in launch["no-prefix-cache"] and "prefix-caching" not in launch["baseline"]
    st.close()

    summary = (run_dir / "SUMMARY.md").read_text()
    assert [line[3:] for line in summary.splitlines() if line.startswith("## ")] == summary_md.SECTIONS
    head = summary.split("## Stack")[0]
    assert (f"Workload: Mooncake trace `{trace}`, replayed on its own clock; 6 requests over 2.0 s of replay per level "
            "(the whole trace); open loop at the trace's own timestamps (mean 2.50 req/s); expected prefix reuse 42%."
            in head)
    workload = summary.split("## Workload")[1].split("## Topology")[0]
    assert "- **Expected prefix reuse**: 41.7% of prompt tokens" in workload
    assert f"| baseline | trace mooncake | {100 * on['mean']:.1f} (no interval) |" in workload  # one repeat
    assert "| no-prefix-cache | trace mooncake | 0 (prefix caching off) |" in workload
    assert "| trace mooncake | " in summary.split("## Single-node results")[1]  # the level named, not C=1
    # the lever's finding cites the hit rates on and off; the reuse finding sets measured against expected
    assert f"prefix-cache hit rate {on['mean']:.0%} → 0% at trace mooncake" in summary
    assert f"Prefix reuse: {on['mean']:.0%} found of 42% expected" in summary

    doc = json.loads((run_dir / "results.json").read_text())
    levels = {v: doc["variants"][v]["levels"][0] for v in ("baseline", "no-prefix-cache")}
    assert levels["baseline"]["prefix_hit_rate"] == pytest.approx(on["mean"])
    assert levels["no-prefix-cache"]["prefix_hit_rate"] == 0.0
    assert doc["variants"]["no-prefix-cache"]["prefix_caching"] is False
    assert doc["workload"]["dataset"] == "mooncake"
    assert doc["workload"]["trace"]["expected_prefix_reuse"] == pytest.approx(EXPECTED, abs=1e-6)
