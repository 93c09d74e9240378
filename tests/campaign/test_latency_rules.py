"""The latency-tail findings from real server spans: the embedded engine (tiny, CPU) sending its spans to two
one-repeat bench runs (long prompts arriving in chunks while short requests decode), their level summaries
stored as a campaign stores each repeat's, read back by collect and diagnosed. No timing value is asserted:
which part and cause the findings name follows from the stored breakdowns, checked against them."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from sample_store import SPEC_TOML, populate  # noqa: E402

from rooftop.bench.latency import PARTS  # noqa: E402
from rooftop.campaign.collect import collect  # noqa: E402
from rooftop.campaign.diagnosis import diagnose  # noqa: E402
from rooftop.campaign.latency_rules import ITL_CAUSE, TTFT_PART  # noqa: E402
from rooftop.campaign.store import Store  # noqa: E402
from tests.bench.test_latency import bench, free_port, write_trace  # noqa: E402
from tests.engine.engine_server import start_engine  # noqa: E402

KEY = 8  # the store's level key for the replayed trace (an open loop's place in the sweep)


@pytest.fixture(scope="module")
def spans_store(tmp_path_factory):
    port = free_port()
    server = start_engine("--otlp-traces-endpoint", f"http://127.0.0.1:{port}/v1/traces",
                          "--chunked-prefill-size", "128")
    rows = [(0, 8, 64)] * 4 + [(100 + 200 * k, 512, 1) for k in range(4)]
    levels = []
    try:
        for r in range(2):
            tmp = tmp_path_factory.mktemp(f"bench{r}")
            out = bench(server.url, port, tmp, dataset="trace", concurrency=[], num_requests=None, seed=r,
                        dataset_path=write_trace(tmp / "t.jsonl", rows))
            assert out.aborted is None
            levels.append(out.summary["levels"][0])
    finally:
        server.stop()
    store = Store.create(tmp_path_factory.mktemp("run"))
    store.put_run("spans", "why the tail", "independent", SPEC_TOML, "spans.toml", {"cpus": 2})
    for r, level in enumerate(levels):
        store.put_level("main", "baseline", r, KEY, level, True)
    return store, levels


def test_findings_name_the_p99_ttft_part_and_the_itl_cause_from_stored_spans(spans_store):
    store, levels = spans_store
    ev = collect(store)
    lv = ev.variants["baseline"].levels[0]
    assert lv.server_spans and len(lv.server_spans) == 2
    findings = {f.rule: f for f in diagnose(ev).findings}
    ttft = findings["ttft_tail"]
    p99s = [lvl["server_spans"]["ttft_breakdown"]["p99"] for lvl in levels]
    shares = {p: sum(b[f"{p}_ms"] / b["ttft_ms"] for b in p99s) / 2 for p in PARTS}
    top = max(PARTS, key=shares.get)
    assert ttft.numbers["part"] == top and ttft.numbers["share"] == pytest.approx(shares[top])
    assert ttft.numbers["repeats"] == 2 and ttft.numbers["share_low"] <= ttft.numbers["share_high"]
    assert ttft.sentence.startswith(f"p99 TTFT {sum(b['ttft_ms'] for b in p99s) / 2:.0f} ms at {lv.at}: "
                                    f"{shares[top]:.0%} [")
    assert TTFT_PART[top][0] in ttft.sentence and "Levers: " in ttft.sentence
    assert ttft.expected_gain is None  # context, not a throughput gain

    # the ITL tail's leading cause over both repeats, as the bench attributed each outlier
    itl = findings["itl_tail"]
    outliers = [lvl["server_spans"]["itl_outliers"] for lvl in levels]
    summed = {c: sum(o["causes"].get(c, 0) for o in outliers) for o in outliers for c in o["causes"]}
    top = max(summed, key=summed.get)
    assert itl.numbers["cause"] == top and itl.numbers["outliers"] == sum(o["count"] for o in outliers)
    assert itl.numbers["share"] == pytest.approx(sum(o["causes"].get(top, 0) / o["count"] for o in outliers) / 2)
    assert ITL_CAUSE[top][0] in itl.sentence and "Levers: " in itl.sentence
    assert itl.sentence.startswith("p99 ITL ") and f" at {lv.at}: " in itl.sentence


def test_without_server_spans_no_latency_finding(tmp_path):
    ev = collect(populate(tmp_path / "run"))
    assert all(lv.server_spans is None for v in ev.variants.values() for lv in v.levels)
    assert not [f for f in diagnose(ev).findings if f.rule in ("ttft_tail", "itl_tail")]
