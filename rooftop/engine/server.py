"""The OpenAI-compatible HTTP front of the engine (FastAPI + uvicorn), with health, metrics and profiling."""

import asyncio
import contextlib
import socket
import sys
import threading
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from rooftop.engine.api_schemas import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    ProfileRequest,
    TokenizeRequest,
    parse_body,
    route_error,
)
from rooftop.engine.auth import check_key
from rooftop.engine.build import ServeConfig, check, engine_in_own_process, resolve_device
from rooftop.engine.engine_process import EngineProcess, log, start_engine
from rooftop.engine.pd.decode import add_decode_role
from rooftop.engine.pd.prefill import add_prefill_role
from rooftop.engine.profiling import warm_profiler
from rooftop.engine.serving import ServerState, respond


def create_app(state: ServerState) -> FastAPI:
    """The routes; no request may raise past them (bad input is a 4xx, anything else a 500 body)."""
    app = FastAPI(title="rooftop-engine", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _no_route(request: Request, exc: StarletteHTTPException):
        err = route_error(request.method, request.url.path, exc.status_code)
        return JSONResponse(err.body(), status_code=err.status, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception):
        return JSONResponse(ApiError(500, f"internal error: {type(exc).__name__}: {exc}").body(), status_code=500)

    async def generate(request: Request, chat: bool):
        arrival_ns = time.time_ns()
        check_key(state.cfg.api_key, request.headers.get("authorization"))
        prep = state.prepare(parse_body(ChatRequest if chat else CompletionRequest, await request.body()), chat)
        state.trace(prep, request.headers.get("x-request-id"), request.headers.get("traceparent"), arrival_ns)
        return await respond(prep, state.events(prep), request)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    @app.get("/v1/models")
    async def models(request: Request):
        check_key(state.cfg.api_key, request.headers.get("authorization"))
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": 0, "owned_by": "rooftop",
            "root": state.cfg.model or state.cfg.preset, "max_model_len": state.cfg.context_length,
        }]}

    @app.get("/pd/info")
    async def pd_info():
        return {"role": state.cfg.role, "kv_port": state.kv_port}

    @app.get("/health")
    async def health():
        if state.engine is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        if state.engine.dead:
            return JSONResponse({"status": "dead", "reason": state.engine.dead}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/tokenize")
    async def tokenize(request: Request):
        req = parse_body(TokenizeRequest, await request.body())
        if (req.prompt is None) == (req.messages is None):
            raise ApiError(400, "give exactly one of prompt or messages", param="prompt")
        try:
            text = req.prompt if req.prompt is not None else state.tokenizer.render_chat(req.messages)
            tokens = state.tokenizer.encode(text, add_bos=req.add_special_tokens)
        except (UnicodeError, AttributeError, TypeError) as exc:
            raise ApiError(400, f"cannot tokenize: {exc}", param="prompt") from None
        return {"tokens": tokens, "count": len(tokens), "max_model_len": state.cfg.context_length}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        req = parse_body(DetokenizeRequest, await request.body())
        return {"prompt": state.tokenizer.decode(req.tokens)}

    @app.post("/start_profile")
    async def start_profile(request: Request):
        raw = await request.body()
        req = parse_body(ProfileRequest, raw) if raw.strip() else ProfileRequest()
        engine = state.ready_engine()
        if not state.cfg.profile_dir:
            raise ApiError(400, "profiling needs a directory: start the server with --profile-dir DIR")
        name = req.name or f"rooftop-engine-{time.strftime('%Y%m%d-%H%M%S')}"
        if "/" in name or name.startswith("."):
            raise ApiError(400, f"profile name {name!r} must be a plain file name", param="name")
        path = Path(state.cfg.profile_dir) / f"{name}.json.gz"
        try:  # on the engine's step thread, between two steps, where the model runs
            graphed = await asyncio.wrap_future(engine.start_profile(path, req.eager))
        except RuntimeError as exc:  # one is already running
            raise ApiError(400, str(exc)) from None
        return {"status": "profiling", "trace": str(path), "cuda_graphs": graphed}

    @app.post("/stop_profile")
    async def stop_profile():
        engine = state.ready_engine()
        try:
            path = await asyncio.wrap_future(engine.stop_profile())
        except RuntimeError as exc:  # none is running
            raise ApiError(400, str(exc)) from None
        return {"trace": path}

    return app


def _flush_spans_at_shutdown(app: FastAPI, state: ServerState) -> None:
    """Send the last spans as the server shuts down: uvicorn re-raises SIGTERM once it has, so serve()'s
    own `finally` does not run then."""
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a):
        try:
            async with inner(a) as value:
                yield value
        finally:
            await asyncio.to_thread(state.tracer.stop)

    app.router.lifespan_context = lifespan


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def serve(cfg: ServeConfig) -> int:
    """Bind, answer /health with 503 while the model loads, print the ready line, serve until stopped."""
    check(cfg)
    own_process = engine_in_own_process(cfg)
    if cfg.profile_dir and not own_process:
        warm_profiler(resolve_device(cfg.device))
    sock = _bind(cfg.host, cfg.port)
    port = sock.getsockname()[1]
    state = ServerState(cfg)
    app = create_app(state)
    ready_note = ""
    if cfg.role == "prefill":
        add_prefill_role(app, state)
    elif cfg.role == "decode":
        ready_note = add_decode_role(app, state, _bind(cfg.host, cfg.kv_port))
    if state.tracer is not None:
        _flush_spans_at_shutdown(app, state)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=3))
    failed = []
    def load() -> None:
        try:
            if own_process:  # built, started and warmed up in the child
                engine = EngineProcess(cfg)
                log(f"the step loop runs in process {engine.pid}, apart from the HTTP front end")
                state.metrics.attach(engine)
            else:
                engine = start_engine(cfg, before_start=[state.metrics.attach, *state.on_engine])
            if state.tracer is not None:  # after the warm-up request: it is no client's
                state.tracer.attach(engine)
            state.vocab_size = engine.vocab_size
        except Exception as exc:  # noqa: BLE001 - the reason goes to the log and the exit status
            print(f"rooftop-engine: failed to start: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            failed.append(exc)
            server.should_exit = True
            return
        state.engine = engine
        print(f"rooftop-engine ready on http://{cfg.host}:{port}{ready_note}", flush=True)

    threading.Thread(target=load, name="rooftop-engine-load", daemon=True).start()
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shut down gracefully on Ctrl-C, then raised it again
        pass
    finally:
        if state.engine is not None:
            state.engine.stop()
        if state.tracer is not None:  # after the engine: its last steps and requests go out too
            state.tracer.stop()
    return 1 if failed else 0
