"""The report's latency figures from a real bench run with server spans (the embedded tiny engine on CPU sending
its spans to the bench's receiver): the TTFT breakdown at p50/p90/p99 and a swimlane of the bench's
timeline.json.gz, drawn into report.html and checked in headless Chromium. No timing value is asserted."""

import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "campaign"))
sys.path.insert(0, str(Path(__file__).parent))

from sample_store import SPEC_TOML  # noqa: E402
from test_html import Page, _headless  # noqa: E402

from rooftop.campaign.store import Store  # noqa: E402
from rooftop.report.build import build_report  # noqa: E402
from rooftop.report.latency_plots import timeline_slice  # noqa: E402
from tests.bench.test_latency import bench, free_port, write_trace  # noqa: E402
from tests.engine.engine_server import start_engine  # noqa: E402


def test_report_draws_the_ttft_breakdown_and_a_swimlane(tmp_path):
    port = free_port()
    server = start_engine("--otlp-traces-endpoint", f"http://127.0.0.1:{port}/v1/traces",
                          "--chunked-prefill-size", "128")
    rows = [(0, 8, 48)] * 3 + [(100 + 200 * k, 384, 1) for k in range(3)]
    store = Store.create(tmp_path)
    store.put_run("spans", "why the tail", "independent", SPEC_TOML, "spans.toml", {"cpus": 2})
    try:
        bench_dir = tmp_path / "blocks" / "main" / "baseline" / "r0" / "bench"
        out = bench(server.url, port, bench_dir, dataset="trace", concurrency=[], num_requests=None,
                    dataset_path=write_trace(tmp_path / "t.jsonl", rows))
    finally:
        server.stop()
    store.put_level("main", "baseline", 0, 8, out.summary["levels"][0], True)
    store.close()

    doc = json.loads(gzip.decompress((bench_dir / "timeline.json.gz").read_bytes()))
    reqs, steps = timeline_slice(doc, n=4)
    assert len({e["tid"] for e in reqs}) == 4 and steps

    report = build_report(tmp_path)
    assert {"ttft_breakdown", "swimlane"} <= set(report.plots)
    summary = report.summary.read_text()
    assert "![ttft_breakdown](plots/ttft_breakdown.png)" in summary and "![swimlane](plots/swimlane.png)" in summary
    url = report.html.as_uri()
    page = Page(_headless(tmp_path, "--dump-dom", url).stdout)
    images = {attrs.get("alt"): attrs["src"] for tag, attrs in page.elements if tag == "img"}
    assert images["ttft_breakdown"].startswith("data:image/png;base64,")
    assert images["swimlane"].startswith("data:image/png;base64,")
    body = next(attrs for tag, attrs in page.elements if tag == "body")
    assert body["data-images"] == body["data-images-loaded"] == str(len(report.plots))
    assert "p99 TTFT " in page.plain()  # the latency finding in the page's findings
