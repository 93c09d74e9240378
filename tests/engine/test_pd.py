"""Prefill/decode disaggregation of the embedded engine, as real processes on 127.0.0.1: a prefill worker, a
decode worker and `rooftop router`, against a single server of the same weights."""

import asyncio
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
import torch
from engine_server import post_json, request, sse_events, start_engine

from rooftop.bench.subproc import ChildServer, python_module
from rooftop.bench.sweep import BenchConfig, run_bench
from rooftop.engine.model.config import ModelConfig
from rooftop.engine.pd.transport import KVRows, TransferError, send_kv

# small caches and context: four engines share two cores and their memory
COMMON = ("--context-length", "512", "--kv-cache-tokens", "4096", "--chunked-prefill-size", "128")


def start_router(prefill_url: str, decode_url: str) -> ChildServer:
    argv = python_module("rooftop.engine.pd.router", "--prefill", prefill_url, "--decode", decode_url, "--port", "0",
                         "--parent-pid", str(os.getpid()))
    return ChildServer(argv, "rooftop-router ready on", timeout_s=120)


def start_pd(single: bool):
    """Prefill (pages of 16) and decode (pages of 32: the rows do not depend on it), and a single server."""
    roles = [("--role", "prefill", "--page-size", "16"), ("--role", "decode", "--page-size", "32")]
    if single:
        roles.append(("--page-size", "16"))
    with ThreadPoolExecutor(len(roles)) as pool:
        futures = [pool.submit(start_engine, *COMMON, *extra) for extra in roles]
        servers = []
        for f in futures:
            try:
                servers.append(f.result())
            except Exception:
                for s in servers:
                    s.stop()
                raise
    return servers


@pytest.fixture(scope="module")
def pd():
    servers = start_pd(single=True)
    try:
        router = start_router(servers[0].url, servers[1].url)
    except Exception:
        for s in servers:
            s.stop()
        raise
    yield {"prefill": servers[0].url, "decode": servers[1].url, "single": servers[2].url, "router": router.url}
    for s in [router, *servers]:
        s.stop()


def metric(url: str, name: str, label: str = "") -> float:
    """Sum of a metric's samples in a server's /metrics whose labels contain `label` (0 when absent)."""
    status, raw = request(url, "/metrics")
    assert status == 200
    return sum(float(m.group(2)) for m in re.finditer(rf"^{name}(?:{{([^}}]*)}})? (\S+)$", raw.decode(), re.M)
               if label in (m.group(1) or ""))


PROMPTS = [
    {"prompt": "The roofline of a GPU", "max_tokens": 12},
    {"prompt": "x" * 300, "max_tokens": 6},  # three prefill chunks of 128 on the prefill worker
    {"prompt": [256, 65, 66, 67], "max_tokens": 1},  # the first token alone: decode only relays it
    {"prompt": "stop here", "max_tokens": 10, "logprobs": 3},
]


def test_greedy_tokens_match_a_single_server_and_decode_never_recomputes(pd):
    prompt_tokens_before = metric(pd["decode"], "rooftop_engine_prefill_tokens_total")
    for extra in PROMPTS:
        body = {"model": "tiny", "temperature": 0, "ignore_eos": True, "return_token_ids": True, **extra}
        status, via_router = post_json(pd["router"], "/v1/completions", body)
        assert status == 200, via_router
        status, single = post_json(pd["single"], "/v1/completions", body)
        assert status == 200, single
        got, want = via_router["choices"][0], single["choices"][0]
        assert got["token_ids"] == want["token_ids"] and len(got["token_ids"]) == extra["max_tokens"]
        assert got["text"] == want["text"] and got["logprobs"] == want["logprobs"]
        assert via_router["usage"] == single["usage"]
    # the decode worker computed no prompt token: its prefill counter did not move, the PD counter says 0
    assert metric(pd["decode"], "rooftop_engine_prefill_tokens_total") == prompt_tokens_before
    assert metric(pd["decode"], "rooftop_pd_decode_prompt_tokens_computed_total") == 0
    assert metric(pd["decode"], "rooftop_engine_decode_tokens_total") >= sum(p["max_tokens"] - 1 for p in PROMPTS)
    # the prefill worker decoded nothing beyond its warm-up's single step
    assert metric(pd["prefill"], "rooftop_engine_decode_tokens_total") <= 1
    sent = metric(pd["prefill"], "rooftop_pd_kv_transfer_bytes_total")
    tiny = ModelConfig.preset("tiny")
    row_bytes = tiny.num_hidden_layers * (tiny.kv_cache_dim + tiny.index_head_dim) * 4  # float32, per token
    assert row_bytes * (22 + 301 + 4 + 10) < sent < row_bytes * (22 + 301 + 4 + 10) + 64 * 1024
    assert metric(pd["router"], "rooftop_pd_kv_transfer_bytes_total") == sent
    assert metric(pd["decode"], "rooftop_pd_kv_transfer_bytes_total") == sent  # what left is what arrived
    assert metric(pd["decode"], "rooftop_pd_kv_transfers_total") >= len(PROMPTS)
    assert metric(pd["router"], "rooftop_pd_kv_transfer_seconds_count") >= len(PROMPTS)


def test_streamed_chat_through_the_router(pd):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    status, raw = request(pd["router"], "/v1/chat/completions", body)
    assert status == 200
    events = sse_events(raw)
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 5
    chunks = [e for e in events[:-2] if e["choices"]]
    assert len(chunks) == 5 and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    status, single = post_json(pd["single"], "/v1/chat/completions",
                               {**body, "stream": False, "stream_options": None})  # only with stream: true
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == single["choices"][0]["message"]["content"]


def test_seeded_sampling_goes_on_from_the_prefill_generator(pd):
    body = {"model": "tiny", "prompt": "seeded", "max_tokens": 8, "temperature": 1.0, "seed": 1234,
            "ignore_eos": True, "return_token_ids": True}
    _, via_router = post_json(pd["router"], "/v1/completions", body)
    _, single = post_json(pd["single"], "/v1/completions", body)
    assert via_router["choices"][0]["token_ids"] == single["choices"][0]["token_ids"]


def test_top_k_stop_token_ids_and_echo_reach_the_decode_worker(pd):
    body = {"model": "tiny", "prompt": "seeded k", "max_tokens": 16, "temperature": 1.0, "seed": 99, "top_k": 3,
            "ignore_eos": True, "return_token_ids": True}
    _, single = post_json(pd["single"], "/v1/completions", body)
    _, via_router = post_json(pd["router"], "/v1/completions", body)
    ids = single["choices"][0]["token_ids"]
    assert via_router["choices"][0]["token_ids"] == ids
    at = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])  # decoded on the decode worker
    stopped = {**body, "stop_token_ids": [ids[at]]}
    _, single = post_json(pd["single"], "/v1/completions", stopped)
    _, via_router = post_json(pd["router"], "/v1/completions", stopped)
    assert single["choices"][0]["token_ids"] == ids[:at + 1] and single["choices"][0]["finish_reason"] == "stop"
    assert via_router["choices"][0] == single["choices"][0]
    # echo: the hand-over carries the prompt's text, so the decode worker puts it first, streamed or not
    echo = {"model": "tiny", "prompt": "echo me", "max_tokens": 4, "temperature": 0, "echo": True}
    _, single = post_json(pd["single"], "/v1/completions", echo)
    _, via_router = post_json(pd["router"], "/v1/completions", echo)
    assert single["choices"][0]["text"].startswith("echo me")
    assert via_router["choices"][0]["text"] == single["choices"][0]["text"]
    status, raw = request(pd["router"], "/v1/completions", {**echo, "stream": True})
    chunks = [e for e in sse_events(raw)[:-1] if e["choices"]]
    assert status == 200 and chunks[0]["choices"][0]["text"].startswith("echo me")
    assert "".join(c["choices"][0]["text"] for c in chunks) == single["choices"][0]["text"]


def test_router_passes_errors_and_side_endpoints_through(pd):
    status, err = post_json(pd["router"], "/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": 0})
    assert status == 400 and err["error"]["param"] == "max_tokens"
    status, err = post_json(pd["router"], "/v1/completions", {"model": "nope", "prompt": "a"})
    assert status == 404 and err["error"]["code"] == "model_not_found"
    status, raw = request(pd["router"], "/v1/completions", b"{not json")
    assert status == 400 and json.loads(raw)["error"]["code"] == "invalid_json"
    status, tok = post_json(pd["router"], "/tokenize", {"prompt": "abc"})
    assert status == 200 and tok["tokens"] == [256, 97, 98, 99]
    status, text = post_json(pd["router"], "/detokenize", {"tokens": [104, 105]})
    assert status == 200 and text["prompt"] == "hi"
    status, raw = request(pd["router"], "/v1/models")
    assert status == 200 and json.loads(raw)["data"][0]["id"] == "tiny"
    status, raw = request(pd["router"], "/health")
    assert status == 200 and json.loads(raw) == {"status": "ok", "prefill": "ok", "decode": "ok"}
    status, raw = request(pd["router"], "/v1/nothing", {"prompt": "a"})
    assert status == 404 and json.loads(raw)["error"]["code"] == "not_found"
    status, raw = request(pd["router"], "/v1/completions", method="GET")
    assert status == 405 and json.loads(raw)["error"]["code"] == "method_not_allowed"


def assert_aborted_and_freed(decode: str, aborts_before: float) -> None:
    """Once the decode worker runs nothing (60 s at most): its pages are free and one more request aborted."""
    deadline = time.monotonic() + 60
    while metric(decode, "rooftop_engine_num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(decode, "rooftop_engine_num_requests_running") == 0
    assert metric(decode, "rooftop_engine_kv_cache_usage") == 0
    assert metric(decode, "rooftop_engine_requests_total", 'finish_reason="abort"') == aborts_before + 1


def test_a_client_that_goes_away_frees_its_pages_on_the_decode_worker(pd):
    aborts_before = metric(pd["decode"], "rooftop_engine_requests_total", 'finish_reason="abort"')
    split = urlsplit(pd["router"])
    conn = http.client.HTTPConnection(split.hostname, split.port, timeout=120)
    body = {"model": "tiny", "prompt": "a" * 60, "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read(7) == b"data: {"  # the first token is out
    conn.close()
    assert_aborted_and_freed(pd["decode"], aborts_before)


def test_a_client_that_goes_away_before_a_non_streamed_reply_frees_its_pages_on_the_decode_worker(pd):
    """The router races the JSON reply against its client and closes the decode stream, so decode aborts it."""
    aborts_before = metric(pd["decode"], "rooftop_engine_requests_total", 'finish_reason="abort"')
    lengths_before = metric(pd["decode"], "rooftop_engine_requests_total", 'finish_reason="length"')
    gone_before = metric(pd["router"], "rooftop_router_requests_total", 'outcome="client_gone"')
    split = urlsplit(pd["router"])
    body = json.dumps({"model": "tiny", "prompt": "a" * 60, "max_tokens": 400, "temperature": 0,
                       "ignore_eos": True}).encode()
    sock = socket.create_connection((split.hostname, split.port), timeout=60)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    deadline = time.monotonic() + 60
    while metric(pd["decode"], "rooftop_engine_num_requests_running") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # until the decode worker holds it
    assert metric(pd["decode"], "rooftop_engine_num_requests_running") == 1
    sock.close()
    assert_aborted_and_freed(pd["decode"], aborts_before)
    assert metric(pd["decode"], "rooftop_engine_requests_total", 'finish_reason="length"') == lengths_before
    assert metric(pd["router"], "rooftop_router_requests_total", 'outcome="client_gone"') == gone_before + 1


def test_a_dropped_request_is_aborted_if_handed_over_and_refused_if_not_yet(pd):
    """`/pd/drop` (the router, when its client left before it claimed the stream): a sequence the prefill
    worker handed over and nobody claimed is aborted at once, not decoded to max_tokens; one not handed over
    yet is refused when its frame comes. Driven here through the prefill worker's own endpoint."""
    status, raw = request(pd["decode"], "/pd/info")
    kv = f"127.0.0.1:{json.loads(raw)['kv_port']}"
    body = {"model": "tiny", "prompt": "a" * 40, "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    aborts_before = metric(pd["decode"], "rooftop_engine_requests_total", 'finish_reason="abort"')
    status, _ = post_json(pd["prefill"], "/pd/prefill", {"request_id": "drop-me", "decode_kv": kv, "chat": False,
                                                         "request": body})
    assert status == 200 and metric(pd["decode"], "rooftop_engine_num_requests_running") == 1  # unclaimed
    status, answer = post_json(pd["decode"], "/pd/drop", {"request_id": "drop-me"})
    assert status == 200 and answer == {"request_id": "drop-me", "aborted": True}
    assert_aborted_and_freed(pd["decode"], aborts_before)
    assert post_json(pd["decode"], "/pd/stream", {"request_id": "drop-me"})[0] == 404

    refused_before = metric(pd["decode"], "rooftop_pd_kv_transfer_failures_total", 'reason="refused"')
    assert post_json(pd["decode"], "/pd/drop", {"request_id": "early"})[1]["aborted"] is False
    status, err = post_json(pd["prefill"], "/pd/prefill", {"request_id": "early", "decode_kv": kv, "chat": False,
                                                           "request": body})
    assert status == 502 and "was dropped: its client left" in err["error"]["message"]
    assert metric(pd["decode"], "rooftop_pd_kv_transfer_failures_total", 'reason="refused"') == refused_before + 1
    assert metric(pd["decode"], "rooftop_engine_num_requests_running") == 0
    assert post_json(pd["decode"], "/pd/drop", {"nope": 1})[0] == 400


def test_bad_frames_are_refused_and_the_decode_worker_stays_up(pd):
    status, raw = request(pd["decode"], "/pd/info")
    info = json.loads(raw)
    assert status == 200 and info["role"] == "decode"
    port = info["kv_port"]
    failures_before = metric(pd["decode"], "rooftop_pd_kv_transfer_failures_total")

    async def garbage() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\n\r\n" + b"\0" * 64)
        await writer.drain()
        answer = await reader.read()
        writer.close()
        return answer

    assert b"bad frame: magic" in asyncio.run(garbage())
    # rows of another model (8 layers) are refused with the reason
    tiny = ModelConfig.preset("tiny")
    rows = KVRows([torch.zeros(2, tiny.kv_cache_dim)] * 8, [torch.zeros(2, tiny.index_head_dim)] * 8)
    header = {"request_id": "other-model", "prompt_token_ids": [256, 97], **rows.describe()}
    with pytest.raises(TransferError, match="num_layers 8 from the prefill worker, 4 here") as exc:
        asyncio.run(send_kv("127.0.0.1", port, header, rows))
    assert exc.value.reason == "refused"
    assert metric(pd["decode"], "rooftop_pd_kv_transfer_failures_total") == failures_before + 2
    status, err = post_json(pd["decode"], "/pd/stream", {"request_id": "never-sent"})
    assert status == 404 and "never-sent" in err["error"]["message"]
    assert request(pd["decode"], "/health")[0] == 200
    status, body = post_json(pd["router"], "/v1/completions", {"model": "tiny", "prompt": "still", "max_tokens": 2,
                                                                "ignore_eos": True})
    assert status == 200 and body["usage"]["completion_tokens"] == 2


def test_a_killed_decode_worker_fails_its_requests_clearly_and_the_router_stays_up(tmp_path):
    prefill, decode = start_pd(single=False)
    router = None
    try:
        router = start_router(prefill.url, decode.url)
        done_ok, streamed, threads = [], {}, []

        def long_stream() -> None:
            """A request decoding when the decode worker dies: it is killed once the first token is out."""
            split = urlsplit(router.url)
            conn = http.client.HTTPConnection(split.hostname, split.port, timeout=120)
            body = {"model": "tiny", "prompt": "a", "max_tokens": 480, "temperature": 0, "ignore_eos": True,
                    "stream": True}
            try:
                conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
                resp = conn.getresponse()
                first = resp.read(7)
                os.kill(decode.proc.pid, signal.SIGKILL)
                streamed.update(status=resp.status, body=first + resp.read())
            except Exception as exc:  # noqa: BLE001 - reported by the assertions below
                streamed.update(status=None, body=repr(exc).encode())
                os.kill(decode.proc.pid, signal.SIGKILL)
            finally:
                conn.close()

        def on_done(rec) -> None:
            if rec.ok and not rec.warmup:
                done_ok.append(rec)
                if len(done_ok) == 2:  # mid-run
                    threads.append(threading.Thread(target=long_stream))
                    threads[0].start()

        cfg = BenchConfig(base_url=router.url, input_len=24, output_len=24, concurrency=[2], num_requests=10,
                          warmup=1, out_dir=tmp_path / "bench", timeout_s=120)
        outcome = asyncio.run(run_bench(cfg, on_request_done=on_done))
        threads[0].join(timeout=120)
        # in flight when it died: the stream ends with an error event that names the worker, and no [DONE]
        assert streamed["status"] == 200, streamed["body"]
        assert b"broke off mid-stream" in streamed["body"] and decode.url.encode() in streamed["body"]
        assert b"[DONE]" not in streamed["body"]
        records = [json.loads(line) for line in (tmp_path / "bench" / "requests.jsonl").read_text().splitlines()]
        measured = [r for r in records if not r["warmup"]]
        assert len(measured) == 10 and outcome.aborted is None  # the router kept answering: the run went on
        ok = [r for r in measured if r["status"] == "ok"]
        failed = [r for r in measured if r["status"] != "ok"]
        assert len(ok) >= 2 and failed and measured[-1]["status"] != "ok"
        # cut off mid-stream (the router's error event names the worker), or (most) a 502 that names it
        assert {r["error_class"] for r in failed} <= {"http_5xx", "stream_error"}
        cut = [r for r in failed if r["error_class"] == "stream_error"]
        assert all("broke off mid-stream" in r["error"] for r in cut)
        after = [r for r in failed if r["error_class"] == "http_5xx"]
        assert after and all("HTTP 502" in r["error"] and "decode worker" in r["error"] for r in after)
        status, raw = request(router.url, "/health")
        health = json.loads(raw)
        assert status == 503 and health["prefill"] == "ok" and decode.url in health["decode"]
        assert request(router.url, "/v1/models")[0] == 200 and request(prefill.url, "/health")[0] == 200
        # A 502 is a failed hand-over (the prefill counts it: "... (decode worker URL)"), or, for a request
        # handed over just before the kill, the router's own failure to open the decode stream ("the
        # decode worker at URL failed"), which no hand-over counter sees.
        # Only a failed hand-over carries the "(decode worker URL)" suffix (its message may itself quote
        # the prefill worker's "the decode worker at ..."): that suffix alone tells the two apart.
        handovers = [r for r in after if f"(decode worker {decode.url})" in r["error"]]
        stream_step = [r for r in after if f"(decode worker {decode.url})" not in r["error"]]
        assert all(f"the decode worker at {decode.url}" in r["error"] for r in stream_step)
        assert metric(prefill.url, "rooftop_pd_kv_transfer_failures_total") >= len(handovers)
        assert metric(router.url, "rooftop_router_requests_total", 'outcome="decode_broke_off"') >= 1
    finally:
        for s in [router, prefill, decode]:
            if s is not None:
                s.stop()


def test_router_cli_refuses_a_bad_url_in_one_line():
    done = subprocess.run([sys.executable, "-m", "rooftop", "router", "--prefill", "localhost:1", "--decode",
                           "http://127.0.0.1:1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--prefill 'localhost:1' is not an http://HOST:PORT URL" in " ".join(done.stderr.split())
