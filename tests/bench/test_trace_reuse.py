"""A trace whose requests share hash_ids, replayed against the embedded engine: the prefix cache's hit rate the
engine reports on /metrics is the trace's expected reuse (within 5 points), and 0 with the cache off."""

import asyncio
import sys
from pathlib import Path

import pytest

from rooftop.bench.sweep import BenchConfig, run_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from engine_server import start_engine  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


@pytest.mark.parametrize("caching", [True, False], ids=["cache-on", "cache-off"])
def test_measured_hit_rate_is_the_traces_expected_reuse(caching, tmp_path):
    flags = () if caching else ("--no-enable-prefix-caching",)
    # a cache that holds the whole trace: nothing it could reuse is evicted
    server = start_engine("--context-length", "2048", "--kv-cache-tokens", "16384", *flags)
    try:
        # one request at a time: each prompt is in the cache before the next looks it up
        cfg = BenchConfig(base_url=server.url, concurrency=[], warmup=0, num_requests=None, max_concurrency=1,
                          dataset="mooncake", dataset_path=str(DATA / "mooncake.jsonl"), trace_speedup=100.0,
                          metrics_url=server.url + "/metrics", telemetry=False, out_dir=tmp_path)
        out = asyncio.run(run_bench(cfg))
    finally:
        server.stop()
    level = out.summary["levels"][0]
    assert level["completed"] == 6 and level["failed"] == 0
    expected = out.summary["trace"]["expected_prefix_reuse"]
    cache = level["engine_server"]["prefix_cache_hit_rate"]
    if caching:
        # every prompt token looked up: the trace's 5,224 (and a token the server adds per prompt, at most)
        assert 5224 <= cache["count"] <= 5224 + 6
        assert expected == pytest.approx(2236 / 5224, abs=1e-6)
        assert abs(cache["mean"] - expected) <= 0.05, (cache, expected)
    else:
        assert cache["mean"] == 0 and cache["count"] == 0  # off: nothing looked up, nothing found
