"""--api-key on the embedded engine and its router, and rooftop's load generator sending it: real
servers on 127.0.0.1, as a vLLM or SGLang server started with --api-key behaves (/v1 routes refuse a
request without `Authorization: Bearer KEY`; health and metrics stay open)."""

import asyncio
import json

import pytest

from rooftop.auth import auth_headers
from rooftop.bench.subproc import ChildServer, python_module
from rooftop.bench.sweep import BenchConfig, run_bench
from rooftop.errors import RooftopError
from tests.engine.engine_server import request, start_engine

KEY = "sk-rooftop-test-42"


def _get(url: str, path: str, key: str | None = None, body: dict | None = None) -> tuple[int, dict]:
    status, raw = request(url, path, body, headers=auth_headers(key))
    return status, json.loads(raw)


@pytest.fixture(scope="module")
def keyed():
    with start_engine("--api-key", KEY) as server:
        yield server.url


def test_v1_routes_want_the_key_and_health_and_metrics_stay_open(keyed):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, "ignore_eos": True}
    for path, payload in (("/v1/models", None), ("/v1/completions", body),
                          ("/v1/chat/completions", {"model": "tiny", "max_tokens": 2,
                                                    "messages": [{"role": "user", "content": "hi"}]})):
        status, err = _get(keyed, path, body=payload)
        assert status == 401 and err["error"]["type"] == "authentication_error", (path, err)
        assert "--api-key" in err["error"]["message"]
        assert _get(keyed, path, "sk-wrong", body=payload)[0] == 401
        status, ok = _get(keyed, path, KEY, body=payload)
        assert status == 200, (path, ok)
    assert _get(keyed, "/v1/completions", KEY, body=body)[1]["usage"]["completion_tokens"] == 2
    assert request(keyed, "/health")[0] == 200 and request(keyed, "/metrics")[0] == 200


def test_bench_sends_the_key_and_writes_it_nowhere(keyed, tmp_path):
    cfg = BenchConfig(base_url=keyed, api_key=KEY, input_len=8, output_len=4, concurrency=[2], num_requests=4,
                      warmup=1, telemetry=False, out_dir=tmp_path, timeout_s=120)
    summary = asyncio.run(run_bench(cfg)).summary
    level = summary["levels"][0]
    assert level["completed"] == 4 and level["failed"] == 0, level
    written = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    assert "summary.json" in {p.name for p in tmp_path.iterdir()} and KEY not in written
    assert json.loads((tmp_path / "summary.json").read_text())["config"]["api_key"] == "<redacted>"


def test_bench_without_the_key_stops_on_one_clear_error(keyed):
    cfg = BenchConfig(base_url=keyed, input_len=8, output_len=4, concurrency=[1], num_requests=2, warmup=0,
                      telemetry=False, timeout_s=60)
    with pytest.raises(RooftopError) as exc:
        asyncio.run(run_bench(cfg))
    assert "HTTP 401" in exc.value.problem and "--api-key" in exc.value.fix


@pytest.mark.timeout(600)
def test_pd_router_wants_the_key_and_passes_it_to_its_workers():
    """Workers and router all started with the key (as a campaign's deployment args start them): a
    keyed request goes through prefill and decode; an unkeyed one is refused at the router."""
    with (start_engine("--role", "prefill", "--api-key", KEY) as prefill,
          start_engine("--role", "decode", "--api-key", KEY) as decode,
          ChildServer(python_module("rooftop", "router", "--prefill", prefill.url, "--decode", decode.url,
                                    "--port", "0", "--api-key", KEY),
                      "rooftop-router ready on", timeout_s=120, env={"OMP_NUM_THREADS": "1"}) as router):
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 3, "ignore_eos": True}
        assert _get(router.url, "/v1/completions", body=body)[0] == 401
        status, out = _get(router.url, "/v1/completions", KEY, body=body)
        assert status == 200 and out["usage"]["completion_tokens"] == 3, out
        assert _get(router.url, "/v1/models", KEY)[0] == 200  # forwarded to decode with the router's key
        assert _get(router.url, "/v1/models")[0] == 401
