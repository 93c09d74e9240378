"""Several tokens a chunk, as speculative decoding streams them: counted per token, timed per chunk, with vLLM's
definitions — ITL one entry per chunk, TPOT = (last token chunk − first) / (output tokens − 1)."""

import asyncio

import pytest

from rooftop.bench.fakeserver import chunk_plan
from rooftop.bench.metrics import itl_ms, tpot_ms
from rooftop.bench.sweep import BenchConfig, run_bench


def test_chunk_plan_cycles_its_pattern_after_the_first_token():
    assert chunk_plan(12, (3, 1, 4)) == [1, 3, 1, 4, 3]
    assert chunk_plan(1, (3,)) == [1] and chunk_plan(5, (1,)) == [1] * 5


@pytest.mark.parametrize("chat", [False, True])
def test_a_bench_counts_tokens_not_chunks_and_times_chunks(fake_server, tmp_path, chat):
    """12 tokens in 5 chunks 20 ms apart: the records count 1, 3, 1, 4, 3 tokens from the usage in every chunk;
    a request has 4 ITLs (one a chunk) and a TPOT of about 4 x 20 / 11 ms, not 20."""
    srv = fake_server("--ttft-ms", "5", "--itl-ms", "20", "--chunk-tokens", "3,1,4")
    cfg = BenchConfig(base_url=srv.url, chat=chat, input_len=12, output_len=12, num_requests=4, warmup=1,
                      concurrency=[2], telemetry=False, out_dir=tmp_path)
    out = asyncio.run(run_bench(cfg))
    recs = [r for r in out.records if not r.warmup]
    assert len(recs) == 4 and all(r.ok for r in recs)
    for r in recs:
        assert r.chunk_tokens == [1, 3, 1, 4, 3] and r.output_tokens == 12 == r.completion_tokens_server
        gaps = itl_ms(r)
        assert len(gaps) == 4 and min(gaps) >= 0.9 * 20
        assert tpot_ms(r) == pytest.approx(sum(gaps) / 11)  # TPOT x (tokens - 1) is the sum of the ITLs
    (level,) = out.summary["levels"]
    assert level["itl_ms"]["n"] == 4 * 4 and level["token_check"]["output_len_mismatch"] == 0
    assert 0.9 * 80 / 11 <= level["tpot_ms"]["median"] < level["itl_ms"]["median"] / 2
