"""A reasoning model's stream: reasoning_content deltas counted apart from the answer; TTFT (first token of any
kind) and time to first output token both reported, in the records, the summary and the table."""

import asyncio

from rooftop.bench.metrics import ttfot_ms, ttft_ms
from rooftop.bench.sweep import BenchConfig, run_bench
from rooftop.bench.table import summary_notes, summary_table


def test_reasoning_deltas_are_counted_apart(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "3", "--itl-ms", "4", "--reasoning-tokens", "3")
    cfg = BenchConfig(base_url=srv.url, chat=True, input_len=12, output_len=8, num_requests=6, warmup=1,
                      concurrency=[2], telemetry=False, out_dir=tmp_path)
    out = asyncio.run(run_bench(cfg))
    recs = [r for r in out.records if not r.warmup]
    assert len(recs) == 6 and all(r.ok for r in recs)
    for r in recs:
        assert r.reasoning_tokens == 3 and len(r.chunk_ns) == 8  # every token times the stream
        assert r.first_content_ns == r.chunk_ns[3]  # the answer starts after three thoughts
        assert r.output_text == "defgh"  # the answer alone: what a quality check compares
        # three token gaps of at least 0.9 x 4 ms lie between the first thought and the first answer token
        assert ttfot_ms(r) - ttft_ms(r) >= 3 * 3.6
    lv = out.summary["levels"][0]
    assert lv["reasoning_tokens"] == 18
    assert lv["ttfot_ms"]["n"] == lv["ttft_ms"]["n"] == 6 and lv["ttfot_ms"]["median"] > lv["ttft_ms"]["median"]
    headers = [c.header for c in summary_table(out.summary).columns]
    assert "TTFT ms p50/p99" in headers and "TTFOT ms p50/p99" in headers
    assert any("C=2 18 reasoning tokens" in n for n in summary_notes(out.summary))


def test_without_reasoning_ttfot_is_ttft_and_the_table_is_unchanged(fake_server):
    srv = fake_server("--ttft-ms", "3", "--itl-ms", "1")
    out = asyncio.run(run_bench(BenchConfig(base_url=srv.url, chat=True, input_len=12, output_len=4, num_requests=4,
                                            warmup=0, telemetry=False)))
    recs = out.records
    assert all(r.reasoning_tokens == 0 and r.first_content_ns == r.chunk_ns[0] for r in recs)
    lv = out.summary["levels"][0]
    assert lv["reasoning_tokens"] == 0 and lv["ttfot_ms"]["median"] == lv["ttft_ms"]["median"]
    assert "TTFOT ms p50/p99" not in [c.header for c in summary_table(out.summary).columns]
