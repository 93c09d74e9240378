"""The OpenAI-compatible HTTP front of the engine (FastAPI + uvicorn), with health, metrics and profiling."""

import asyncio
import json
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
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
    stop_list,
)
from rooftop.engine.auth import check_key
from rooftop.engine.disconnect import until_disconnected
from rooftop.engine.engine import Engine, TokenEvent
from rooftop.engine.engine_process import EngineProcess, log, start_engine
from rooftop.engine.launch import ServeConfig, check, engine_in_own_process, resolve_device
from rooftop.engine.metrics import EngineMetrics
from rooftop.engine.openai_format import Reply, TextOffsets, full_response, stream_chunk, usage_chunk
from rooftop.engine.profiling import warm_profiler
from rooftop.engine.sequence import SamplingParams, Sequence
from rooftop.engine.tokenizer import ByteTokenizer

DEFAULT_COMPLETION_MAX_TOKENS = 16  # as OpenAI and vLLM; chat defaults to the rest of the context


@dataclass(slots=True)
class Prepared:
    """A validated request, ready for the engine."""

    prompt_ids: list[int]
    params: SamplingParams
    stops: list[str]
    stream: bool
    include_usage: bool
    reply: Reply


class Handoff:
    """Token events from the engine thread to an event loop, one wake-up per burst.

    A decode step hands out a token for every running request at once. Waking the loop once per
    event (call_soon_threadsafe writes its self-pipe each time) cost the engine thread a system call
    and a turn of the GIL per token. Events queue here, and the first one of a burst schedules one
    drain, which passes them all to their requests' queues in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Queue, TokenEvent]] = []

    def put(self, inbox: asyncio.Queue, ev: TokenEvent) -> None:
        with self._lock:
            self._items.append((inbox, ev))
            if len(self._items) > 1:
                return  # a drain is already scheduled
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            pass

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for inbox, ev in items:
            inbox.put_nowait(ev)


class ServerState:
    """What the routes share: the engine once built (in this process, or an EngineProcess), the
    tokenizer, metrics."""

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        self.model_name = cfg.model_name()
        self.engine: Engine | EngineProcess | None = None
        self.vocab_size = 0
        self.tokenizer = ByteTokenizer()
        self.metrics = EngineMetrics(self.model_name)
        self.kv_port: int | None = None  # the decode role's KV listener
        self.on_engine: list[Callable[[Engine], None]] = []  # called with the engine once built, before it starts
        self._handoff: Handoff | None = None

    def ready_engine(self) -> Engine | EngineProcess:
        if self.engine is None:
            raise ApiError(503, "the engine is still loading; retry when /health returns 200", code="not_ready")
        if self.engine.dead:
            raise ApiError(503, f"{self.engine.dead}; restart the server (its log says why)", code="engine_dead")
        return self.engine

    # ---- requests -> engine input ---------------------------------------------------------------
    def prepare(self, req: CompletionRequest | ChatRequest, chat: bool) -> Prepared:
        self.ready_engine()
        if req.model is not None and req.model != self.model_name:
            raise ApiError(404, f"The model `{req.model}` does not exist; this server serves `{self.model_name}`.",
                           param="model", code="model_not_found")
        ctx = self.cfg.context_length
        prompt = None if chat else req.one_prompt()
        try:
            if chat:
                messages = [{"role": m.role, "content": m.content if not isinstance(m.content, list)
                             else "".join(p.text for p in m.content)} for m in req.messages]
                prompt_ids = self.tokenizer.encode(self.tokenizer.render_chat(messages))
            elif isinstance(prompt, str):
                prompt_ids = self.tokenizer.encode(prompt)
            else:
                prompt_ids = list(prompt)
        except UnicodeError as exc:
            raise ApiError(400, f"the prompt is not encodable as UTF-8: {exc}", param="prompt") from None
        if not prompt_ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        if max(prompt_ids) >= self.vocab_size:
            raise ApiError(400, f"prompt token ids must be below the vocabulary size {self.vocab_size}",
                           param="prompt")
        if req.stop_token_ids and max(req.stop_token_ids) >= self.vocab_size:
            raise ApiError(400, f"stop_token_ids must be below the vocabulary size {self.vocab_size}",
                           param="stop_token_ids")
        echo = not chat and req.echo
        if echo and req.logprobs is not None:
            raise ApiError(400, "echo with logprobs would need the prompt's logprobs, which this engine does not "
                           "compute; drop echo or logprobs", param="echo", code="unsupported_parameter")
        param = "messages" if chat else "prompt"
        if len(prompt_ids) >= ctx:
            raise ApiError(400, f"This model's maximum context length is {ctx} tokens. However, your prompt is "
                           f"{len(prompt_ids)} tokens, leaving no room for a completion.",
                           param=param, code="context_length_exceeded")
        # errors name the field the client sent
        max_param = "max_completion_tokens" if chat and req.max_completion_tokens is not None else "max_tokens"
        max_tokens = req.max_completion_tokens if max_param == "max_completion_tokens" else req.max_tokens
        if max_tokens is None:
            max_tokens = ctx - len(prompt_ids) if chat else min(DEFAULT_COMPLETION_MAX_TOKENS, ctx - len(prompt_ids))
        if max_tokens <= 0:
            raise ApiError(400, f"{max_param} must be at least 1, not {max_tokens}", param=max_param)
        if len(prompt_ids) + max_tokens > ctx:
            raise ApiError(400, f"This model's maximum context length is {ctx} tokens. However, you requested "
                           f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the {param}, "
                           f"{max_tokens} in the completion).", param=max_param, code="context_length_exceeded")
        if req.min_tokens > max_tokens:
            raise ApiError(400, f"min_tokens ({req.min_tokens}) must not exceed {max_param} ({max_tokens})",
                           param="min_tokens")
        if chat:
            num_logprobs = (req.top_logprobs or 0) if req.logprobs else None
        else:
            num_logprobs = req.logprobs
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=max(req.top_k, 0),
            seed=req.seed,
            stop_token_ids=list(req.stop_token_ids),
            ignore_eos=req.ignore_eos,
            min_tokens=req.min_tokens,
            logprobs=num_logprobs,
        )
        reply = Reply(self.model_name, chat, len(prompt_ids), prompt_ids if req.return_token_ids else None,
                      num_logprobs)
        if echo:  # the prompt as given, or its tokens' text
            reply.echo = prompt if isinstance(prompt, str) else self.tokenizer.decode(prompt_ids)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return Prepared(prompt_ids, params, stop_list(req.stop), req.stream, include_usage, reply)

    async def events(self, prep: Prepared, export_kv: Callable[[Sequence], None] | None = None,
                     ) -> AsyncIterator[TokenEvent]:
        """The request's tokens as the engine makes them; aborts it in the engine if the caller stops early."""
        engine = self.ready_engine()
        inbox, sink = self.inbox()
        seq_id = engine.submit(prep.prompt_ids, prep.params, prep.stops, sink, export_kv=export_kv)
        async for ev in self.drain(seq_id, inbox):
            yield ev

    def inbox(self) -> tuple[asyncio.Queue, Callable[[TokenEvent], None]]:
        """A queue on this event loop and the sink the engine thread feeds it through."""
        loop = asyncio.get_running_loop()
        if self._handoff is None or self._handoff.loop is not loop:
            self._handoff = Handoff(loop)
        handoff = self._handoff
        inbox: asyncio.Queue[TokenEvent] = asyncio.Queue()

        def sink(ev: TokenEvent) -> None:
            handoff.put(inbox, ev)

        return inbox, sink

    async def drain(self, seq_id: int, inbox: asyncio.Queue) -> AsyncIterator[TokenEvent]:
        """Events of request seq_id until its last; aborts it in the engine if the caller stops early."""
        done = False
        try:
            while not done:
                ev = await inbox.get()
                done = ev.finish_reason is not None
                if done:
                    self.metrics.finished(ev.finish_reason)
                yield ev
        finally:
            if not done:  # the client went away (or the server stops): free its pages now
                if self.engine is not None:
                    self.engine.abort(seq_id)
                self.metrics.finished("abort")


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def respond(prep: Prepared, events: AsyncIterator[TokenEvent], request: Request) -> Response:
    """The OpenAI reply of a request's events: an SSE stream, or one JSON body once the request ends.

    A client that goes away ends its request in the engine either way: a stream's response stops at the
    disconnect, and a JSON body is raced against it (see until_disconnected)."""
    if prep.stream:
        return StreamingResponse(_stream(prep, events), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await until_disconnected(request, _whole(prep, events))


async def _whole(prep: Prepared, events: AsyncIterator[TokenEvent]) -> Response:
    got = [ev async for ev in events]
    if got and got[-1].finish_reason == "error":
        raise ApiError(500, got[-1].error or "engine error", code="engine_error")
    return JSONResponse(full_response(prep.reply, got))


async def _stream(prep: Prepared, events: AsyncIterator[TokenEvent]) -> AsyncIterator[str]:
    num_tokens, offsets = 0, TextOffsets()
    async for ev in events:
        if ev.finish_reason == "error":
            yield _sse(ApiError(500, ev.error or "engine error", code="engine_error").body())
            break
        yield _sse(stream_chunk(prep.reply, ev, num_tokens == 0, offsets.next(ev.token_id)))
        num_tokens += 1
    else:
        if prep.include_usage:
            yield _sse(usage_chunk(prep.reply, num_tokens))
    yield "data: [DONE]\n\n"


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
        check_key(state.cfg.api_key, request.headers.get("authorization"))
        req = parse_body(ChatRequest if chat else CompletionRequest, await request.body())
        prep = state.prepare(req, chat)
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
        from rooftop.engine.pd.prefill import add_prefill_role

        add_prefill_role(app, state)
    elif cfg.role == "decode":
        from rooftop.engine.pd.decode import add_decode_role

        ready_note = add_decode_role(app, state, _bind(cfg.host, cfg.kv_port))
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
    return 1 if failed else 0
