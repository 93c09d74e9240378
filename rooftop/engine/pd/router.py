"""`rooftop router`: the OpenAI-compatible front of a prefill/decode pair.

Each generation request goes to the prefill worker's `/pd/prefill` with the decode worker's KV address; the
prefill worker computes the prompt and its first token and hands the sequence to the decode worker over TCP;
the router then streams `/pd/stream` from the decode worker (the first token included) back to the client.
So the TTFT a client sees includes the transfer. A failure of either worker fails that request with an
OpenAI-style 502/503 that names the worker; the router itself stays up.
"""

import argparse
import asyncio
import contextlib
import json
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aiohttp
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from rooftop.engine.api_schemas import ApiError, route_error
from rooftop.engine.auth import bearer, check_key
from rooftop.engine.disconnect import CLIENT_GONE, until_disconnected
from rooftop.engine.pd.metrics import PDMetrics

HEALTH_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 10.0


class WorkerError(Exception):
    """A worker that cannot be reached or broke off: (status for the client, message naming the worker)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Router:
    """Forwards requests to the prefill worker and streams the decode worker's reply."""

    def __init__(self, prefill_url: str, decode_url: str, api_key: str | None = None):
        self.prefill_url = prefill_url.rstrip("/")
        self.decode_url = decode_url.rstrip("/")
        self.api_key = api_key  # wanted of clients on /v1 routes, and sent to the workers (started with it too)
        self.http: aiohttp.ClientSession | None = None
        self.kv_address: str | None = None  # decode's "host:port", learned from its /pd/info
        self.registry = CollectorRegistry()
        self.pd = PDMetrics(self.registry, "router", "router")
        self.requests = Counter("rooftop_router_requests", "Generation requests, by outcome.", ["outcome"],
                                registry=self.registry)
        self.tasks: set[asyncio.Future] = set()  # drops sent after their request was cancelled

    async def start(self) -> None:
        # no total timeout: a long generation streams for as long as it takes
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S)
        self.http = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0),
                                          headers=bearer(self.api_key))

    async def stop(self) -> None:
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=HEALTH_TIMEOUT_S)
        if self.http is not None:
            await self.http.close()

    # ---- the workers ------------------------------------------------------------------------------
    async def decode_kv_address(self, refresh: bool = False) -> str:
        """The decode worker's KV host:port (the host of its URL, the port it announces)."""
        if self.kv_address is None or refresh:
            status, body = await self._get_json(self.decode_url + "/pd/info", "decode")
            if status != 200 or body.get("role") != "decode" or not body.get("kv_port"):
                raise WorkerError(503, f"the decode worker at {self.decode_url} is not a decode role "
                                  f"(/pd/info answered {status}: {body})")
            host = urlsplit(self.decode_url).hostname or "127.0.0.1"
            self.kv_address = f"[{host}]:{body['kv_port']}" if ":" in host else f"{host}:{body['kv_port']}"
        return self.kv_address

    async def _get_json(self, url: str, worker: str) -> tuple[int, dict]:
        try:
            async with self.http.get(url, timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)) as resp:
                return resp.status, await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise WorkerError(503, f"the {worker} worker at {self._url(worker)} is unreachable: "
                              f"{type(exc).__name__}: {exc}") from None

    def _url(self, worker: str) -> str:
        return self.prefill_url if worker == "prefill" else self.decode_url

    async def health(self) -> tuple[int, dict]:
        """200 when both workers answer /health with 200; else 503 saying which does not."""
        async def probe(worker: str) -> str:
            try:
                status, _ = await self._get_json(self._url(worker) + "/health", worker)
            except WorkerError as exc:
                return str(exc)
            return "ok" if status == 200 else f"{self._url(worker)}/health answered {status}"

        prefill, decode = await asyncio.gather(probe("prefill"), probe("decode"))
        ok = prefill == "ok" and decode == "ok"
        return (200 if ok else 503), {"status": "ok" if ok else "degraded", "prefill": prefill, "decode": decode}

    # ---- one generation request -------------------------------------------------------------------
    async def generate(self, raw: bytes, chat: bool, client_id: str | None = None,
                       traceparent: str | None = None) -> Response:
        """One generation request; client_id (its X-Request-Id) and traceparent reach both workers' spans."""
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object", code="invalid_value")
        request_id = uuid.uuid4().hex
        # the workers' spans: the client's request id (else ours), and one trace id (ours, 16 random bytes)
        trace = {"request_id": client_id or request_id, "trace_id": request_id, "traceparent": traceparent}
        try:
            resp = await self._prefill(request_id, body, chat, trace)
            if resp is not None:  # the prefill worker refused it (bad request, transfer failed): pass it on
                self.requests.labels(outcome=f"prefill_{resp.status_code}").inc()
                return resp
            return await self._from_decode(request_id)
        except asyncio.CancelledError:
            # The client left (`until_disconnected`) before its reply was whole. A claimed stream aborts as it
            # closes; but the decode worker may hold the sequence unclaimed (the prefill handed it over while we
            # waited for the prefill's answer), or get it any moment: it drops it rather than decode it on.
            self._background(self._drop(request_id))
            raise
        except WorkerError as exc:
            self.requests.labels(outcome="worker_error").inc()
            return JSONResponse(ApiError(exc.status, str(exc), code="worker_unavailable").body(),
                                status_code=exc.status)

    async def _prefill(self, request_id: str, body: dict, chat: bool, trace: dict) -> Response | None:
        """Prefill and hand over; None when the decode worker holds the sequence, else the error to return."""
        for attempt in (0, 1):
            kv = await self.decode_kv_address(refresh=attempt > 0)
            payload = {"request_id": request_id, "decode_kv": kv, "chat": chat, "request": body, "trace": trace}
            try:
                async with self.http.post(self.prefill_url + "/pd/prefill", json=payload) as resp:
                    answer = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise WorkerError(502, f"the prefill worker at {self.prefill_url} failed: "
                                  f"{type(exc).__name__}: {exc}") from None
            if status == 200:
                done = json.loads(answer)
                self.pd.transferred(done["transfer_bytes"], done["transfer_seconds"])
                return None
            code = _error_code(answer)
            if code == "kv_transfer_failed":
                self.pd.failed("prefill_reported")
                if attempt == 0 and await self._decode_moved():
                    continue  # the decode worker restarted on another KV port: once more
                message = _error_message(answer)
                return JSONResponse(ApiError(502, f"{message} (decode worker {self.decode_url})",
                                             code="kv_transfer_failed").body(), status_code=502)
            return Response(answer, status_code=status, media_type="application/json")
        raise AssertionError("unreachable")

    def _background(self, work) -> None:
        """Run `work` past this request's cancellation (a reference is kept until it ends)."""
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _drop(self, request_id: str) -> None:
        """Ask the decode worker to drop a request nobody will claim; a failure only leaves it to expire there."""
        try:
            async with self.http.post(self.decode_url + "/pd/drop", json={"request_id": request_id},
                                      timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)) as resp:
                await resp.read()
        except (aiohttp.ClientError, TimeoutError):
            pass

    async def _decode_moved(self) -> bool:
        """Whether the decode worker now announces another KV address than the one we used."""
        old = self.kv_address
        try:
            return await self.decode_kv_address(refresh=True) != old
        except WorkerError:
            return False

    async def _from_decode(self, request_id: str) -> Response:
        """The decode worker's reply, streamed; a failure before the first byte is a 502 of its own."""
        url = self.decode_url + "/pd/stream"
        try:
            resp = await self.http.post(url, json={"request_id": request_id})
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise WorkerError(502, f"the decode worker at {self.decode_url} failed: {type(exc).__name__}: {exc}") \
                from None
        media_type = resp.headers.get("Content-Type", "application/json")
        if resp.status != 200 or not media_type.startswith("text/event-stream"):
            try:
                answer = await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                resp.close()
                raise WorkerError(502, f"the decode worker at {self.decode_url} broke off: "
                                  f"{type(exc).__name__}: {exc}") from None
            except BaseException:  # the client went away (cancelled): dropping the connection aborts it on decode
                resp.close()
                raise
            resp.release()
            if resp.status != 200:  # the request was fine (prefill took it): whatever failed is the worker's
                self.requests.labels(outcome=f"decode_{resp.status}").inc()
                raise WorkerError(502, f"the decode worker at {self.decode_url} answered {resp.status}: "
                                  f"{_error_message(answer)}")
            self.requests.labels(outcome="ok").inc()
            return Response(answer, status_code=200, media_type=media_type)
        try:
            first = await resp.content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            resp.close()
            raise WorkerError(502, f"the decode worker at {self.decode_url} broke off: {type(exc).__name__}: {exc}") \
                from None
        except BaseException:  # the client went away before the first token
            resp.close()
            raise
        return StreamingResponse(self._relay(resp, first), media_type=media_type,
                                 headers={"Cache-Control": "no-cache"})

    async def _relay(self, resp: aiohttp.ClientResponse, first: bytes) -> AsyncIterator[bytes]:
        """The SSE bytes as they come; when decode breaks off, an error event and no [DONE]."""
        done = False
        try:
            if first:
                yield first
            while chunk := await resp.content.readany():
                yield chunk
            done = True
            self.requests.labels(outcome="ok").inc()
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.requests.labels(outcome="decode_broke_off").inc()
            err = ApiError(502, f"the decode worker at {self.decode_url} broke off mid-stream: "
                           f"{type(exc).__name__}: {exc}", code="worker_unavailable")
            yield f"\n\ndata: {json.dumps(err.body())}\n\n".encode()
        finally:
            if done:
                resp.release()
            else:  # the client went away or decode broke off: dropping the connection aborts it on decode
                resp.close()

    async def forward(self, method: str, path: str, raw: bytes | None) -> Response:
        """Pass a request on to the prefill worker (models, tokenize, detokenize)."""
        try:
            async with self.http.request(method, self.prefill_url + path, data=raw,
                                         headers={"Content-Type": "application/json"}) as resp:
                return Response(await resp.read(), status_code=resp.status,
                                media_type=resp.headers.get("Content-Type", "application/json"))
        except (aiohttp.ClientError, TimeoutError) as exc:
            err = ApiError(502, f"the prefill worker at {self.prefill_url} is unreachable: {type(exc).__name__}: {exc}",
                           code="worker_unavailable")
            return JSONResponse(err.body(), status_code=502)


def _error_body(raw: bytes) -> dict:
    try:
        err = json.loads(raw).get("error")
        return err if isinstance(err, dict) else {}
    except (ValueError, AttributeError):
        return {}


def _error_code(raw: bytes) -> str | None:
    return _error_body(raw).get("code")


def _error_message(raw: bytes) -> str:
    return _error_body(raw).get("message") or raw[:300].decode("utf-8", "replace")


def create_router_app(router: Router) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        await router.start()
        try:
            yield
        finally:
            await router.stop()

    app = FastAPI(title="rooftop-router", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _no_route(request: Request, exc: StarletteHTTPException):
        err = route_error(request.method, request.url.path, exc.status_code)
        return JSONResponse(err.body(), status_code=err.status, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception):
        return JSONResponse(ApiError(500, f"router error: {type(exc).__name__}: {exc}").body(), status_code=500)

    async def generate(request: Request, chat: bool) -> Response:
        check_key(router.api_key, request.headers.get("authorization"))
        reply = await until_disconnected(request, router.generate(await request.body(), chat,
                                                                  request.headers.get("x-request-id"),
                                                                  request.headers.get("traceparent")))
        if reply.status_code == CLIENT_GONE:
            router.requests.labels(outcome="client_gone").inc()
        return reply

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    @app.get("/v1/models")
    async def models(request: Request):
        check_key(router.api_key, request.headers.get("authorization"))
        return await router.forward("GET", "/v1/models", None)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        return await router.forward("POST", "/tokenize", await request.body())

    @app.post("/detokenize")
    async def detokenize(request: Request):
        return await router.forward("POST", "/detokenize", await request.body())

    @app.get("/health")
    async def health():
        status, body = await router.health()
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(router.registry), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def serve_router(prefill_url: str, decode_url: str, host: str = "127.0.0.1", port: int = 30000,
                 api_key: str | None = None) -> int:
    """Bind, print `rooftop-router ready on http://HOST:PORT`, serve until stopped."""
    for name, url in (("--prefill", prefill_url), ("--decode", decode_url)):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{name} {url!r} is not an http://HOST:PORT URL")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    sock.listen(2048)  # connections made right after the ready line wait in the backlog for uvicorn
    server = uvicorn.Server(uvicorn.Config(create_router_app(Router(prefill_url, decode_url, api_key)), log_level="warning",
                                           access_log=False, timeout_graceful_shutdown=3))
    print(f"rooftop-router ready on http://{host}:{sock.getsockname()[1]} "
          f"(prefill {prefill_url}, decode {decode_url})", flush=True)
    server.run(sockets=[sock])
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m rooftop.engine.pd.router --prefill URL --decode URL [--host H] [--port P]`."""
    parser = argparse.ArgumentParser(prog="python -m rooftop.engine.pd.router",
                                     description="The OpenAI-compatible router of a prefill/decode pair.")
    parser.add_argument("--prefill", required=True, help="URL of the --role prefill server")
    parser.add_argument("--decode", required=True, help="URL of the --role decode server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000, help="0 = pick a free port (printed when ready)")
    parser.add_argument("--api-key", default=None, help="wanted of clients on /v1 routes, and sent to the workers")
    from rooftop.engine.parent_watch import add_parent_pid, exit_with_parent

    add_parent_pid(parser)
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        exit_with_parent(args.parent_pid)
    try:
        return serve_router(args.prefill, args.decode, args.host, args.port, args.api_key)
    except (ValueError, OSError) as exc:
        print(f"rooftop-router: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
