"""The engine's HTTP API: health, models, tokenize, completions streamed and not, errors, metrics, profiles."""

import gzip
import json
import os
import signal
import socket
import subprocess
import time

import pytest
from engine_server import post_json, python_module, request, sse_events, start_engine

CONTEXT = 128


@pytest.fixture(scope="module", params=["off", "on"], ids=["engine-in-server", "engine-process"])
def server(tmp_path_factory, request):
    """The server with its step loop in its own process and without (--engine-process): the API is the same."""
    profile_dir = tmp_path_factory.mktemp("profiles")
    s = start_engine("--context-length", str(CONTEXT), "--page-size", "16", "--kv-cache-tokens", "1024",
                     "--served-model-name", "tiny-test", "--profile-dir", str(profile_dir),
                     "--engine-process", request.param)
    yield s.url
    s.stop()


def test_health_models_and_tokenize(server):
    assert request(server, "/health")[0] == 200
    status, raw = request(server, "/v1/models")
    models = json.loads(raw)
    assert status == 200 and [m["id"] for m in models["data"]] == ["tiny-test"]
    assert models["data"][0]["max_model_len"] == CONTEXT
    status, tok = post_json(server, "/tokenize", {"prompt": "héllo"})
    # <bos> then the UTF-8 bytes (é is two)
    assert status == 200 and tok["tokens"] == [256, 104, 195, 169, 108, 108, 111] and tok["count"] == 7
    status, tok2 = post_json(server, "/tokenize", {"prompt": "héllo", "add_special_tokens": False})
    assert tok2["count"] == 6
    status, detok = post_json(server, "/detokenize", {"tokens": tok["tokens"]})
    assert status == 200 and detok == {"prompt": "héllo"}


def test_completion_usage_matches_tokenize(server):
    prompt = "The roof is"
    _, tok = post_json(server, "/tokenize", {"prompt": prompt})
    status, body = post_json(server, "/v1/completions", {
        "model": "tiny-test", "prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": True})
    assert status == 200, body
    assert body["object"] == "text_completion" and body["model"] == "tiny-test"
    assert body["usage"] == {"prompt_tokens": tok["count"], "completion_tokens": 5, "total_tokens": tok["count"] + 5}
    assert body["choices"][0]["finish_reason"] == "length"


def test_stream_has_one_chunk_per_token_then_usage_then_done(server):
    req = {"prompt": "abc", "max_tokens": 6, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    _, whole = post_json(server, "/v1/completions", req)
    status, raw = request(server, "/v1/completions", {**req, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert len(chunks) == 6
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]
    assert [c["choices"][0]["token_ids"][0] for c in chunks] == whole["choices"][0]["token_ids"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    # without include_usage: no usage chunk
    events = sse_events(request(server, "/v1/completions", {**req, "stream": True})[1])
    assert len(events) == 7 and all("usage" not in e for e in events[:-1])


def test_chat_stream_and_template(server):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    _, tok = post_json(server, "/tokenize", {"prompt": "system: be brief\nuser: hi\nassistant: "})
    status, body = post_json(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 3,
                                                               "temperature": 0, "ignore_eos": True})
    assert status == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["prompt_tokens"] == tok["count"] and body["usage"]["completion_tokens"] == 3
    status, raw = request(server, "/v1/chat/completions", {
        "messages": messages, "max_tokens": 3, "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}})
    events = sse_events(raw)
    assert events[0]["object"] == "chat.completion.chunk" and events[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(e["choices"][0]["delta"]["content"] for e in events[:3])
    assert content == body["choices"][0]["message"]["content"]
    assert events[3]["usage"] == body["usage"] and events[4] == "[DONE]"


def test_logprobs_of_completions(server):
    status, body = post_json(server, "/v1/completions", {"prompt": "x", "max_tokens": 3, "temperature": 0,
                                                          "ignore_eos": True, "logprobs": 2})
    lp = body["choices"][0]["logprobs"]
    assert status == 200 and len(lp["tokens"]) == 3 and len(lp["top_logprobs"]) == 3
    for token, token_lp, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        # greedy: the chosen token is the best of the top-2, and its logprob is the top one
        assert len(top) == 2 and max(top, key=top.get) == token and top[token] == pytest.approx(token_lp)
        assert token_lp <= 0


@pytest.mark.parametrize("body, status, param", [
    ({"prompt": "a" * CONTEXT}, 400, "prompt"),  # CONTEXT bytes + <bos> > context
    ({"prompt": "a" * 100, "max_tokens": 40}, 400, "max_tokens"),  # 101 + 40 > 128
    ({"prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "a", "max_tokens": -3}, 400, "max_tokens"),
    ({"prompt": "a", "max_tokens": "5"}, 400, "max_tokens"),
    ({"prompt": "a", "max_tokens": 2.5}, 400, "max_tokens"),
    ({"prompt": 5}, 400, "prompt"),
    ({"prompt": "a", "temperature": -1}, 400, "temperature"),
    ({"prompt": "a", "top_p": 0}, 400, "top_p"),
    ({"prompt": "a", "stream": "yes"}, 400, "stream"),
    ({"prompt": "a", "min_tokens": 9, "max_tokens": 3}, 400, "min_tokens"),
    ({"prompt": [], "max_tokens": 3}, 400, "prompt"),
    ({"prompt": [1, 999999]}, 400, "prompt"),
    ({"prompt": "a", "model": "gpt-4"}, 404, "model"),
    ({"max_tokens": 3}, 400, "prompt"),
])
def test_bad_requests_get_openai_errors(server, body, status, param):
    got, err = post_json(server, "/v1/completions", body)
    assert got == status, err
    assert set(err["error"]) == {"message", "type", "param", "code"} and err["error"]["message"]
    assert err["error"]["param"].split(".")[0] == param


def test_bad_json_and_context_error_code(server):
    status, raw = request(server, "/v1/chat/completions", b"{not json")
    assert status == 400 and "error" in json.loads(raw)
    status, err = post_json(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "a" * 200}]})
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"
    assert request(server, "/health")[0] == 200


def test_metrics_count_tokens_and_steps(server):
    def scrape() -> dict[str, float]:
        text = request(server, "/metrics")[1].decode()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line and not line.startswith("#")}

    before = scrape()
    post_json(server, "/v1/completions", {"prompt": "abcd", "max_tokens": 4, "temperature": 0, "ignore_eos": True})
    after = scrape()
    key = '{model_name="tiny-test"}'
    # prompt of 5 tokens in one prefill step, then 3 decode steps of 1 token (the 4th token comes from the 3rd)
    assert after["rooftop_engine_prefill_tokens_total" + key] - before["rooftop_engine_prefill_tokens_total" + key] == 5
    assert after["rooftop_engine_decode_tokens_total" + key] - before["rooftop_engine_decode_tokens_total" + key] == 3
    step = 'rooftop_engine_step_seconds_count{kind="decode",model_name="tiny-test"}'
    assert after[step] - before[step] == 3
    # the forward's device time is a GPU engine's: on the CPU the series is there and counts nothing
    assert after['rooftop_engine_step_device_seconds_count{kind="decode",model_name="tiny-test"}'] == 0
    assert after["rooftop_engine_num_requests_running" + key] == 0
    assert after["rooftop_engine_kv_cache_usage" + key] == 0.0
    assert "rooftop_engine_num_requests_waiting" + key in after


def test_bench_reads_the_engine_step_histogram(server):
    """What a campaign reads around each level: the engine's step totals by kind, the same as its
    histogram's series, and their difference over requests it served."""
    from rooftop.bench.engine_metrics import parse_step_totals, step_delta

    def totals():
        text = request(server, "/metrics")[1].decode()
        lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
        return parse_step_totals(text), lines

    before, _ = totals()
    post_json(server, "/v1/completions", {"prompt": "abcd", "max_tokens": 5, "temperature": 0, "ignore_eos": True})
    after, lines = totals()
    series = '{kind="decode",model_name="tiny-test"}'
    assert after["decode"] == (float(lines["rooftop_engine_step_seconds_sum" + series]),
                               float(lines["rooftop_engine_step_seconds_count" + series]))
    delta = step_delta(before, after)
    assert delta["decode"]["steps"] == 4 and delta["prefill"]["steps"] == 1
    assert delta["decode"]["ms_per_step"] > 0
    assert step_delta(before, before) is None and step_delta(None, after) is None


def test_profile_writes_a_trace_with_named_modules(server):
    status, _ = request(server, "/stop_profile", b"", method="POST")
    assert status == 400  # nothing running
    status, started = post_json(server, "/start_profile", {"name": "t1"})
    assert status == 200
    assert request(server, "/start_profile", b"", method="POST")[0] == 400  # one at a time
    post_json(server, "/v1/completions", {"prompt": "abc", "max_tokens": 2, "temperature": 0, "ignore_eos": True})
    status, stopped = post_json(server, "/stop_profile", {})
    assert status == 200 and stopped["trace"].endswith("t1.json.gz") and stopped["trace"] == started["trace"]
    with gzip.open(stopped["trace"]) as f:
        trace = json.load(f)
    names = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "python_function"}
    # No RMSNorm: every norm runs inside another kernel (the first with the embedding, `step_inputs`).
    for module in ("Indexer", "SparseAttention", "MoE", "DenseMLP", "Sampler"):
        assert any(n.startswith(f"nn.Module: {module}_") for n in names), module
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]
    assert any("Input Dims" in e.get("args", {}) for e in ops)  # record_shapes


def test_health_is_503_until_ready_then_200():
    """A second server, polled from the moment its port answers: 503s (while loading), then 200 for good."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = python_module("rooftop.engine", "--preset", "tiny", "--port", str(port), "--device", "cpu",
                         "--kv-cache-tokens", "4096", "--parent-pid", str(os.getpid()))
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        statuses: list[int] = []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = request(f"http://127.0.0.1:{port}", "/health", timeout_s=10)[0]
            except OSError:  # not bound yet
                time.sleep(0.01)
                continue
            statuses.append(status)
            if status == 200:
                break
        # how many 503s depends on the machine's speed; that none is anything else, and 200 ends it, does not
        assert statuses and statuses[-1] == 200 and set(statuses[:-1]) <= {503}, statuses
        assert all(request(f"http://127.0.0.1:{port}", "/health")[0] == 200 for _ in range(3))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def metric_sum(url: str, name: str) -> float:
    """Sum of the samples in /metrics whose line starts with name."""
    text = request(url, "/metrics")[1].decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_client_gone_mid_stream_frees_the_request(server):
    import http.client
    from urllib.parse import urlparse

    def scrape(name: str) -> float:
        return metric_sum(server, name)

    decoded_before = scrape("rooftop_engine_decode_tokens_total")
    lengths_before = scrape('rooftop_engine_requests_total{finish_reason="length"')
    aborts_before = scrape('rooftop_engine_requests_total{finish_reason="abort"')
    u = urlparse(server)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "go", "max_tokens": 120, "ignore_eos": True,
                                                        "stream": True}), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read(6) == b"data: "
    conn.close()  # gone after the first token
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and scrape("rooftop_engine_num_requests_running") > 0:
        time.sleep(0.05)
    assert scrape("rooftop_engine_num_requests_running") == 0
    assert scrape("rooftop_engine_kv_cache_usage") == 0  # its pages are free
    # ended as aborted, not at its length: dropped before its 119 decode steps (the first token is prefill's)
    assert scrape('rooftop_engine_requests_total{finish_reason="abort"') == aborts_before + 1
    assert scrape('rooftop_engine_requests_total{finish_reason="length"') == lengths_before
    assert scrape("rooftop_engine_decode_tokens_total") - decoded_before < 119
    assert request(server, "/health")[0] == 200


def test_client_gone_before_a_non_streamed_reply_frees_the_request(server):
    """A JSON reply goes out only at the end: the request must still end when its client closes the socket."""
    from urllib.parse import urlparse

    running, usage = "rooftop_engine_num_requests_running", "rooftop_engine_kv_cache_usage"
    abort, length = ('rooftop_engine_requests_total{finish_reason="abort"',
                     'rooftop_engine_requests_total{finish_reason="length"')
    aborts_before, lengths_before = metric_sum(server, abort), metric_sum(server, length)
    decoded_before = metric_sum(server, "rooftop_engine_decode_tokens_total")
    body = json.dumps({"prompt": "go", "max_tokens": 120, "ignore_eos": True}).encode()
    u = urlparse(server)
    sock = socket.create_connection((u.hostname, u.port), timeout=60)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and metric_sum(server, running) == 0:  # in the engine
        time.sleep(0.01)
    assert metric_sum(server, running) == 1
    sock.close()  # gone before its reply
    while time.monotonic() < deadline and metric_sum(server, running) > 0:
        time.sleep(0.05)
    assert metric_sum(server, running) == 0 and metric_sum(server, usage) == 0  # its slot and pages are free
    # ended as aborted, before its 119 decode steps; it was counted as ended by length before the fix
    assert metric_sum(server, abort) == aborts_before + 1
    assert metric_sum(server, length) == lengths_before
    assert metric_sum(server, "rooftop_engine_decode_tokens_total") - decoded_before < 119
    status, body = post_json(server, "/v1/completions", {"prompt": "go", "max_tokens": 2, "ignore_eos": True})
    assert status == 200 and body["usage"]["completion_tokens"] == 2
