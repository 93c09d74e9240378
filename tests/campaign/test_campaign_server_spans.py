"""A campaign wires both ends of the server's spans: the embedded engine started with --otlp-traces-endpoint
on a free port of 127.0.0.1, the bench's receiver there; every stored request carries its TTFT in parts."""

import subprocess
import sys
from pathlib import Path

import pytest

from rooftop.adapters.common import TRACES_ARG, traces_endpoint
from rooftop.campaign.server_spans import receiver_for, traced
from rooftop.campaign.store import Store
from rooftop.spec.bench import BenchSettings
from rooftop.spec.deployment import DeploymentSpec

CAMPAIGN = """
[campaign]
name = "spans"
goal = "each request's TTFT in parts"
[model]
preset = "tiny"
[deployment]
engine = "embedded"
args = { indexer-bound = "actual", context-length = 512 }
[bench]
input_len = 16
output_len = 4
concurrency = [2]
requests_per_level = 6
repeats = 1
warmup = 1
timeout_s = 120
[profile]
enabled = false
"""
PARTS = ("client_wait_ms", "client_to_server_ms", "queue_ms", "prefill_ms", "prefill_wait_ms", "kv_transfer_ms",
         "emission_ms")


@pytest.mark.timeout(400)
def test_a_campaign_stores_each_requests_ttft_in_parts(tmp_path):
    spec = tmp_path / "c.toml"
    spec.write_text(CAMPAIGN)
    out = subprocess.run([sys.executable, "-m", "rooftop", "run", str(spec), "--runs-dir", str(tmp_path / "runs")],
                         capture_output=True, text=True, timeout=380)
    assert out.returncode == 0, out.stderr[-3000:]
    st = Store.open(Path(out.stdout.strip().splitlines()[-1]))
    try:
        (dep,) = st.deployments()
        records = [r for r in st.requests("baseline", concurrency=2) if r["status"] == "ok"]
        (level,) = [lv for lv in st.levels() if lv.concurrency == 2]
    finally:
        st.close()
    assert dep.spec["args"][TRACES_ARG].startswith("http://127.0.0.1:")
    assert len(records) == 6
    for r in records:
        b = r["ttft_breakdown"]
        ttft = (r["chunk_ns"][0] - r["decided_ns"]) / 1e6
        assert b["ttft_ms"] == pytest.approx(ttft, abs=1e-3)
        assert all(b[p] >= 0 for p in PARTS), b
        assert abs(sum(b[p] for p in PARTS) - ttft) <= max(1.0, 0.02 * ttft), b
    spans = level.summary["server_spans"]
    assert spans["joined"] == spans["requests"] == 6 and spans["note"] is None


def _dep(engine: str, **extra) -> DeploymentSpec:
    return DeploymentSpec.model_validate({"engine": engine, "model": "m", "single": {"port": 0}, **extra})


def test_traced_wires_embedded_and_vllm_but_not_sglang_nor_a_users_endpoint():
    settings = BenchSettings()
    for engine in ("embedded", "vllm"):
        dep = traced(_dep(engine))
        endpoint = traces_endpoint(dep)
        assert endpoint.startswith("http://127.0.0.1:") and endpoint.endswith("/v1/traces")
        assert receiver_for(dep, settings) == endpoint.removeprefix("http://").removesuffix("/v1/traces")
    assert traced(_dep("vllm")).env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"  # not gRPC
    assert traces_endpoint(traced(_dep("sglang"))) is None
    own = _dep("vllm", args={TRACES_ARG: "http://127.0.0.1:4318/v1/traces"})
    assert traced(own) == own and receiver_for(own, settings) is None  # the user's collector listens there
    assert receiver_for(own, BenchSettings(otlp_receiver="127.0.0.1:4318")) == "127.0.0.1:4318"
