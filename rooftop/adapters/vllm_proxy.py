"""A prefill/decode proxy for two vLLM servers joined by a KV connector (vLLM's own lives in its tests/).

Each completion goes to prefill with max_tokens=1 and `kv_transfer_params.do_remote_decode`; the
prefill's answer carries the params that tell decode where the KV is; decode's answer streams back.
A failed leg fails that request with a 502 naming the server, never the proxy. /tokenize and
/detokenize go to prefill (both servers load the same tokenizer), so a bench through the proxy sizes
its prompts as it would against one server.

/metrics joins both servers', each metric family from the worker where it means what it means on one
server: time to first token, queue and prefill time from prefill (where the prompt is computed and
requests wait for it; decode's TTFT starts once the KV arrived), everything else from decode (the
inter-token latency, tokens per step, decode time, the KV it took in). Every sample carries a
`pd_role` label naming its worker; a family comes from one worker only, so summing over labels adds
nothing up twice.

    python -m rooftop.adapters.vllm_proxy --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 --port 8000
"""

import argparse
import asyncio
import re
import uuid

from aiohttp import ClientError, ClientSession, ClientTimeout, web

READY_LINE = "vllm-proxy ready on http://{host}:{port}"
PREFILL = web.AppKey("prefill", str)
DECODE = web.AppKey("decode", str)
SESSION = web.AppKey("session", ClientSession)
REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def prefill_request(body: dict) -> dict:
    """The request prefill gets: one token, no stream, asking to hand its KV to a remote decode."""
    req = {k: v for k, v in body.items() if k not in ("stream_options", "min_tokens", "min_completion_tokens")}
    req["kv_transfer_params"] = dict(REMOTE_DECODE)
    req["stream"] = False
    req["max_tokens"] = 1
    if "max_completion_tokens" in req:
        req["max_completion_tokens"] = 1
    return req


def decode_request(body: dict, prefill_response: dict) -> dict:
    """The original request plus the prefill's kv_transfer_params (where decode fetches the KV from)."""
    req = dict(body)
    params = prefill_response.get("kv_transfer_params")
    if params:
        req["kv_transfer_params"] = params
    return req


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


def _client_auth(request: web.Request) -> dict[str, str]:
    """The client's Authorization header (an API key), passed on to the workers as it came."""
    return {"Authorization": request.headers["Authorization"]} if "Authorization" in request.headers else {}


async def _complete(request: web.Request, path: str) -> web.StreamResponse:
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "request body is not JSON", "invalid_request_error")
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object", "invalid_request_error")
    app = request.app
    headers = {"X-Request-Id": request.headers.get("X-Request-Id", str(uuid.uuid4())), **_client_auth(request)}
    session = app[SESSION]
    prefill, decode = app[PREFILL], app[DECODE]
    try:
        async with session.post(prefill + path, json=prefill_request(body), headers=headers) as resp:
            if resp.status != 200:
                return await _worker_error(resp, "prefill", prefill)
            prefill_response = await resp.json()
    except (TimeoutError, ClientError, ValueError) as exc:
        return _error(502, f"prefill {prefill} failed: {exc!r}", "prefill_failed")
    out: web.StreamResponse | None = None
    try:
        async with session.post(decode + path, json=decode_request(body, prefill_response), headers=headers) as resp:
            if resp.status != 200:
                return await _worker_error(resp, "decode", decode)
            out = web.StreamResponse(headers={"Content-Type": resp.headers.get("Content-Type", "application/json")})
            await out.prepare(request)
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out
    except (TimeoutError, ClientError) as exc:
        if out is None:
            return _error(502, f"decode {decode} failed: {exc!r}", "decode_failed")
        raise  # headers already sent: dropping the connection is the only signal left


async def _worker_error(resp, role: str, url: str) -> web.Response:
    """A worker's refusal of the request itself (4xx: bad input, a missing API key) keeps its status, so the
    client sees what it did wrong; anything else is this proxy's 502 naming the worker."""
    text = (await resp.text())[:500]
    if 400 <= resp.status < 500:
        return _error(resp.status, f"{role} {url} answered {resp.status}: {text}", f"{role}_refused")
    return _error(502, f"{role} {url} answered {resp.status}: {text}", f"{role}_failed")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, "/v1/completions")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, "/v1/chat/completions")


async def health(request: web.Request) -> web.Response:
    """200 when both servers answer their /health, 503 naming the one that does not."""
    session = request.app[SESSION]
    for name, key in (("prefill", PREFILL), ("decode", DECODE)):
        url = request.app[key] + "/health"
        try:
            async with session.get(url, timeout=ClientTimeout(total=2)) as resp:
                if resp.status != 200:
                    return web.json_response({"status": f"{name} {url} answered {resp.status}"}, status=503)
        except (TimeoutError, ClientError):
            return web.json_response({"status": f"{name} {url} unreachable"}, status=503)
    return web.json_response({"status": "ok"})


async def tokenize(request: web.Request) -> web.Response:
    """/tokenize and /detokenize: both servers load the same tokenizer; prefill answers."""
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "request body is not JSON", "invalid_request_error")
    prefill = request.app[PREFILL]
    try:
        async with request.app[SESSION].post(prefill + request.path, json=body) as resp:
            return web.Response(body=await resp.read(), status=resp.status,
                                content_type=resp.content_type or "application/json")
    except (TimeoutError, ClientError) as exc:
        return _error(502, f"prefill {prefill} failed: {exc!r}", "prefill_failed")


# Metric families read from prefill (the rest from decode): vLLM's names, newer and older.
PREFILL_FAMILIES = frozenset({"vllm:time_to_first_token_seconds", "vllm:request_queue_time_seconds",
                              "vllm:request_prefill_time_seconds"})
_COMMENT = re.compile(r"^#\s*(?:HELP|TYPE)\s+(\S+)")
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?(\s.*)$")
_SUFFIXES = ("_bucket", "_sum", "_count", "_created", "_total", "_info")


def family_of(name: str, current: str | None) -> str:
    """The family a sample `name` belongs to: the one its HELP/TYPE lines opened, when it is that name
    plus a suffix, else the name without its suffix."""
    if current and (name == current or name.startswith(current) and name[len(current):] in _SUFFIXES):
        return current
    return next((name[: -len(s)] for s in _SUFFIXES if name.endswith(s)), name)


def pick_families(text: str, role: str, wanted) -> list[str]:
    """The lines of Prometheus `text` whose family `wanted(family)` accepts, each sample labelled pd_role=`role`."""
    out, current = [], None
    for line in text.splitlines():
        comment = _COMMENT.match(line)
        if comment:
            current = comment.group(1)
            if wanted(current):
                out.append(line)
            continue
        sample = _SAMPLE.match(line)
        if not sample or not wanted(family_of(sample.group(1), current)):
            continue
        name, labels, rest = sample.groups()
        labels = f'{{{labels[1:-1]},pd_role="{role}"}}' if labels and labels != "{}" else f'{{pd_role="{role}"}}'
        out.append(name + labels + rest)
    return out


async def _scrape(session: ClientSession, url: str) -> str | None:
    try:
        async with session.get(url + "/metrics", timeout=ClientTimeout(total=10)) as resp:
            return await resp.text() if resp.status == 200 else None
    except (TimeoutError, ClientError, UnicodeDecodeError):
        return None


async def metrics(request: web.Request) -> web.Response:
    """Both workers' /metrics as one (see the module's docstring); a worker that does not answer leaves its
    families out rather than the other's standing in for them; 502 when neither answers."""
    prefill, decode = request.app[PREFILL], request.app[DECODE]
    texts = await asyncio.gather(_scrape(request.app[SESSION], prefill), _scrape(request.app[SESSION], decode))
    if texts == [None, None]:
        return _error(502, f"neither prefill {prefill} nor decode {decode} answered /metrics", "metrics_failed")
    lines = [f"# rooftop pd proxy: {', '.join(sorted(PREFILL_FAMILIES))} from prefill {prefill}"
             f"{'' if texts[0] is not None else ' (not answering)'}; the rest from decode {decode}"
             f"{'' if texts[1] is not None else ' (not answering)'}"]
    if texts[0] is not None:
        lines += pick_families(texts[0], "prefill", lambda family: family in PREFILL_FAMILIES)
    if texts[1] is not None:
        lines += pick_families(texts[1], "decode", lambda family: family not in PREFILL_FAMILIES)
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


async def models(request: web.Request) -> web.Response:
    session = request.app[SESSION]
    try:
        async with session.get(request.app[DECODE] + "/v1/models", headers=_client_auth(request)) as resp:
            return web.json_response(await resp.json(), status=resp.status)
    except (TimeoutError, ClientError, ValueError) as exc:
        return _error(502, f"decode failed: {exc!r}", "decode_failed")


def make_app(prefill: str, decode: str) -> web.Application:
    """The proxy as an aiohttp application in front of `prefill` and `decode` base URLs."""
    app = web.Application()
    app[PREFILL], app[DECODE] = prefill.rstrip("/"), decode.rstrip("/")

    async def session_ctx(app: web.Application):
        app[SESSION] = ClientSession(timeout=ClientTimeout(total=None))
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", tokenize)
    return app


async def _serve(args: argparse.Namespace) -> None:
    runner = web.AppRunner(make_app(args.prefill, args.decode), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = runner.addresses[0][1]
    print(READY_LINE.format(host=args.host, port=port), flush=True)
    await asyncio.Event().wait()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill", required=True, help="prefill server base URL")
    parser.add_argument("--decode", required=True, help="decode server base URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed)")
    return parser


def main() -> None:
    try:
        asyncio.run(_serve(build_parser().parse_args()))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
