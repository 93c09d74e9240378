"""rooftop's vLLM pd proxy between two real HTTP servers that answer the way vLLM's KV connector does."""

import asyncio
import json

from aiohttp import ClientSession, web

from rooftop.adapters.vllm_proxy import decode_request, make_app, prefill_request

KV_PARAMS = {"do_remote_prefill": True, "remote_engine_id": "e1", "remote_block_ids": [3, 4], "remote_host": "h"}


def test_request_rewrites():
    body = {"model": "m", "prompt": "hi", "max_tokens": 64, "stream": True, "stream_options": {"include_usage": True},
            "min_tokens": 8, "max_completion_tokens": 64}  # fmt: skip
    pre = prefill_request(body)
    assert (pre["max_tokens"], pre["max_completion_tokens"], pre["stream"]) == (1, 1, False)
    assert "stream_options" not in pre and "min_tokens" not in pre
    assert pre["kv_transfer_params"]["do_remote_decode"] is True
    dec = decode_request(body, {"kv_transfer_params": KV_PARAMS})
    assert dec["kv_transfer_params"] == KV_PARAMS and dec["max_tokens"] == 64 and dec["min_tokens"] == 8
    assert body["max_tokens"] == 64 and "kv_transfer_params" not in body  # the client's request is untouched


async def _site(app):
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def _scenario():
    seen = {"prefill": [], "decode": []}

    async def prefill_completions(request):
        seen["prefill"].append((await request.json(), request.headers.get("X-Request-Id")))
        return web.json_response({"choices": [{"text": "A"}], "kv_transfer_params": KV_PARAMS})

    async def decode_completions(request):
        seen["decode"].append((await request.json(), request.headers.get("X-Request-Id")))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("A", "B", "C"):
            await resp.write(f"data: {json.dumps({'choices': [{'text': word}]})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def ok(request):
        return web.json_response({"ok": True})

    prefill_app, decode_app = web.Application(), web.Application()
    prefill_app.router.add_post("/v1/completions", prefill_completions)
    prefill_app.router.add_get("/health", ok)
    decode_app.router.add_post("/v1/completions", decode_completions)
    decode_app.router.add_get("/health", ok)
    p_runner, p_url = await _site(prefill_app)
    d_runner, d_url = await _site(decode_app)
    x_runner, x_url = await _site(make_app(p_url, d_url))
    out = {}
    try:
        async with ClientSession() as s:
            async with s.get(x_url + "/health") as r:
                out["health_up"] = r.status
            body = {"model": "m", "prompt": "hello", "max_tokens": 3, "stream": True}
            async with s.post(x_url + "/v1/completions", json=body) as r:
                out["status"], out["stream"] = r.status, await r.text()
            await d_runner.cleanup()  # the decode server dies
            async with s.post(x_url + "/v1/completions", json=body) as r:
                out["failed_status"], out["failed"] = r.status, await r.json()
            async with s.get(x_url + "/health") as r:
                out["health_down"], out["health_body"] = r.status, await r.json()
    finally:
        await x_runner.cleanup()
        await p_runner.cleanup()
    return seen, out, d_url


def test_prefill_then_decode_stream_and_a_dead_decode():
    seen, out, d_url = asyncio.run(_scenario())
    (pre, pre_id), (dec, dec_id) = seen["prefill"][0], seen["decode"][0]
    assert pre["max_tokens"] == 1 and pre["stream"] is False and pre["kv_transfer_params"]["do_remote_decode"]
    assert dec["max_tokens"] == 3 and dec["stream"] is True and dec["kv_transfer_params"] == KV_PARAMS
    assert pre_id == dec_id and pre_id  # one request id across both legs
    assert out["health_up"] == 200 and out["status"] == 200
    texts = [json.loads(line[6:])["choices"][0]["text"] for line in out["stream"].split("\n\n") if line.startswith("data: {")]
    assert texts == ["A", "B", "C"] and out["stream"].rstrip().endswith("data: [DONE]")
    # A dead decode fails that request with a 502 naming it; the proxy itself stays up.
    assert out["failed_status"] == 502 and out["failed"]["error"]["type"] == "decode_failed"
    assert d_url in out["failed"]["error"]["message"]
    assert out["health_down"] == 503 and "decode" in out["health_body"]["status"]


def _vllm_metrics(ttft_s: float, itl_s: float, n: int) -> str:
    """A vLLM /metrics page (as prometheus_client writes it) after `n` requests."""
    return (
        "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.\n"
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {n}\n'
        f'vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {n}\n'
        f'vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {ttft_s * n}\n'
        "# TYPE vllm:request_prefill_time_seconds histogram\n"
        f'vllm:request_prefill_time_seconds_count{{engine="0",model_name="m"}} {n}\n'
        f'vllm:request_prefill_time_seconds_sum{{engine="0",model_name="m"}} {ttft_s * n}\n'
        "# TYPE vllm:inter_token_latency_seconds histogram\n"
        f'vllm:inter_token_latency_seconds_count{{engine="0",model_name="m"}} {10 * n}\n'
        f'vllm:inter_token_latency_seconds_sum{{engine="0",model_name="m"}} {itl_s * 10 * n}\n'
        "# TYPE vllm:external_prefix_cache_hits counter\n"
        f'vllm:external_prefix_cache_hits_total{{engine="0",model_name="m"}} {48 * n}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
    )


async def _metrics_scenario():
    state = {"n": 0}

    def worker(ttft_s, itl_s):
        async def metrics(request):
            return web.Response(text=_vllm_metrics(ttft_s, itl_s, state["n"]))

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        return app

    p_runner, p_url = await _site(worker(0.800, 0.050))  # prefill: 800 ms to its one token
    d_runner, d_url = await _site(worker(0.004, 0.020))  # decode: first token 4 ms after the KV came
    x_runner, x_url = await _site(make_app(p_url, d_url))
    texts = []
    try:
        async with ClientSession() as s:
            for n in (0, 10):
                state["n"] = n
                async with s.get(x_url + "/metrics") as r:
                    texts.append(await r.text())
            await p_runner.cleanup()  # prefill gone: its families are left out, not taken from decode
            async with s.get(x_url + "/metrics") as r:
                texts.append(await r.text())
            await d_runner.cleanup()
            async with s.get(x_url + "/metrics") as r:
                texts.append((r.status, await r.json()))
    finally:
        await x_runner.cleanup()
    return texts


def test_pd_metrics_take_each_family_from_the_worker_it_describes():
    from rooftop.bench.engine_metrics import level_delta, parse_totals

    before, after, no_prefill, (status, error) = asyncio.run(_metrics_scenario())
    _, server = level_delta(parse_totals(before), parse_totals(after))
    assert server["ttft_ms"]["mean"] == 800.0 and server["prefill_ms"]["mean"] == 800.0  # prefill's
    assert server["itl_ms"]["mean"] == 20.0 and server["itl_ms"]["count"] == 100  # decode's, counted once
    lines = after.splitlines()
    assert 'vllm:time_to_first_token_seconds_sum{engine="0",model_name="m",pd_role="prefill"} 8.0' in lines
    assert 'vllm:external_prefix_cache_hits_total{engine="0",model_name="m",pd_role="decode"} 480' in lines
    assert 'vllm:num_requests_running{engine="0",model_name="m",pd_role="decode"} 0.0' in lines
    assert not any('pd_role="decode"' in line for line in lines if line.startswith("vllm:time_to_first_token"))
    assert lines[0].startswith("# rooftop pd proxy: ") and "from prefill http://127.0.0.1:" in lines[0]
    header, *rest = no_prefill.splitlines()
    assert "(not answering)" in header and not any(line.startswith("vllm:time_to_first_token") for line in rest)
    assert "vllm:inter_token_latency_seconds_sum" in no_prefill
    assert status == 502 and error["error"]["type"] == "metrics_failed"


async def _keyed_scenario():
    """Workers that want `Bearer k` on /v1 (as vLLM --api-key) and one that fails with a 500."""
    seen = []

    def keyed(handler):
        async def guarded(request):
            seen.append((request.path, request.headers.get("Authorization")))
            if request.headers.get("Authorization") != "Bearer k":
                return web.json_response({"error": "Unauthorized"}, status=401)
            return await handler(request)
        return guarded

    async def prefill_ok(request):
        return web.json_response({"choices": [{"text": "A"}], "kv_transfer_params": KV_PARAMS})

    async def decode_ok(request):
        return web.json_response({"choices": [{"text": "ABC"}]})

    async def models(request):
        return web.json_response({"data": [{"id": "m"}]})

    async def broken(request):
        return web.json_response({"error": "boom"}, status=500)

    prefill_app, decode_app, broken_app = web.Application(), web.Application(), web.Application()
    prefill_app.router.add_post("/v1/completions", keyed(prefill_ok))
    decode_app.router.add_post("/v1/completions", keyed(decode_ok))
    decode_app.router.add_get("/v1/models", keyed(models))
    broken_app.router.add_post("/v1/completions", broken)
    runners, urls = zip(*[await _site(a) for a in (prefill_app, decode_app, broken_app)], strict=True)
    proxies = [await _site(make_app(urls[0], urls[1])), await _site(make_app(urls[2], urls[1]))]
    out = {}
    body = {"model": "m", "prompt": "hello", "max_tokens": 3}
    try:
        async with ClientSession() as s:
            x_url, broken_url = proxies[0][1], proxies[1][1]
            for name, headers in (("keyed", {"Authorization": "Bearer k"}), ("unkeyed", {})):
                async with s.post(x_url + "/v1/completions", json=body, headers=headers) as r:
                    out[name] = r.status, await r.json()
                async with s.get(x_url + "/v1/models", headers=headers) as r:
                    out[name + "_models"] = r.status
            async with s.post(broken_url + "/v1/completions", json=body) as r:
                out["broken"] = r.status, await r.json()
    finally:
        for runner in [p[0] for p in proxies] + list(runners):
            await runner.cleanup()
    return seen, out


def test_the_client_key_goes_to_both_workers_and_their_refusals_keep_their_status():
    seen, out = asyncio.run(_keyed_scenario())
    assert out["keyed"][0] == 200 and out["keyed"][1]["choices"][0]["text"] == "ABC"
    assert out["keyed_models"] == 200 and out["unkeyed_models"] == 401
    assert ("/v1/completions", "Bearer k") in seen and ("/v1/models", "Bearer k") in seen
    # A worker's 401 reaches the client as a 401 naming the worker, not as the proxy's own 502.
    status, err = out["unkeyed"]
    assert status == 401 and err["error"]["type"] == "prefill_refused" and "Unauthorized" in err["error"]["message"]
    # A worker that fails (5xx) is still the proxy's 502 naming it.
    assert out["broken"][0] == 502 and out["broken"][1]["error"]["type"] == "prefill_failed"
