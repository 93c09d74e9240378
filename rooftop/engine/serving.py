"""What the HTTP routes share, the pd roles' too: the server's state, a request prepared for the engine,
and its reply (an SSE stream or one JSON body)."""

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from rooftop.engine.api_schemas import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    stop_list,
)
from rooftop.engine.build import ServeConfig
from rooftop.engine.disconnect import CLIENT_GONE, until_disconnected
from rooftop.engine.engine import Engine, TokenEvent
from rooftop.engine.engine_process import EngineProcess
from rooftop.engine.metrics import EngineMetrics
from rooftop.engine.openai_format import Reply, TextOffsets, full_response, stream_chunk, usage_chunk
from rooftop.engine.sequence import SamplingParams, Sequence
from rooftop.engine.spans import RequestTrace
from rooftop.engine.tokenizer import ByteTokenizer
from rooftop.engine.tracing import Tracer

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
    trace: RequestTrace | None = None  # with --otlp-traces-endpoint: its stamps, closed as the server is done


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
        self.tracer = Tracer(cfg.otlp_traces_endpoint, self.model_name, cfg.role) if cfg.otlp_traces_endpoint else None
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

    def trace(self, prep: Prepared, request_id: str | None, traceparent: str | None, arrival_ns: int,
              trace_id_hex: str | None = None) -> None:
        """With tracing on, start prep's trace: the client's request id (else the reply's), its traceparent."""
        if self.tracer is None:
            return
        t = self.tracer.start(request_id or prep.reply.request_id, traceparent, trace_id_hex, arrival_ns)
        p = prep.params
        t.max_tokens, t.temperature, t.top_p, t.num_prompt_tokens = (p.max_tokens, p.temperature, p.top_p,
                                                                     len(prep.prompt_ids))
        prep.trace = t

    async def events(self, prep: Prepared, export_kv: Callable[[Sequence], None] | None = None,
                     ) -> AsyncIterator[TokenEvent]:
        """The request's tokens as the engine makes them; aborts it in the engine if the caller stops early."""
        engine = self.ready_engine()
        inbox, sink = self.inbox()
        seq_id = engine.submit(prep.prompt_ids, prep.params, prep.stops, sink, export_kv=export_kv)
        if prep.trace is not None and isinstance(engine, Engine):  # an EngineProcess's id is not the engine's
            prep.trace.seq_id = seq_id
        async for ev in self.drain(seq_id, inbox, prep.trace):
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

    async def drain(self, seq_id: int, inbox: asyncio.Queue, trace: RequestTrace | None = None,
                    ) -> AsyncIterator[TokenEvent]:
        """Events of request seq_id until its last; aborts it in the engine if the caller stops early."""
        done = False
        try:
            while not done:
                ev = await inbox.get()
                done = ev.finish_reason is not None
                if trace is not None:
                    _stamp(trace, ev)
                if done:
                    self.metrics.finished(ev.finish_reason)
                yield ev
        finally:
            if not done:  # the client went away (or the server stops): free its pages now
                if self.engine is not None:
                    self.engine.abort(seq_id)
                self.metrics.finished("abort")
                if trace is not None:
                    trace.finish_ns, trace.finish_reason = time.time_ns(), "abort"


def _stamp(trace: RequestTrace, ev: TokenEvent) -> None:
    """A request's event reached the event loop: its first token, or its end."""
    if ev.seq_id >= 0:
        trace.seq_id = ev.seq_id
    if not trace.first_token_ns and ev.token_id >= 0:
        trace.first_token_ns = time.time_ns()
    if ev.finish_reason is not None:
        trace.finish_ns, trace.finish_reason = time.time_ns(), ev.finish_reason
        trace.num_prompt_tokens, trace.num_completion_tokens = ev.num_prompt_tokens, ev.num_completion_tokens


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def respond(prep: Prepared, events: AsyncIterator[TokenEvent], request: Request) -> Response:
    """The OpenAI reply of a request's events: an SSE stream, or one JSON body once the request ends.

    A client that goes away ends its request in the engine either way: a stream's response stops at the
    disconnect, and a JSON body is raced against it (see until_disconnected)."""
    if prep.stream:
        return StreamingResponse(_stream(prep, events), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    trace = prep.trace
    try:
        resp = await until_disconnected(request, _whole(prep, events))
    except BaseException:
        if trace is not None:
            trace.close()
        raise
    if trace is not None:
        if resp.status_code == CLIENT_GONE:
            trace.close()
        else:  # runs once the body is sent: the first token reaches the client with the last
            resp.background = BackgroundTask(_written, trace)
    return resp


def _written(trace: RequestTrace) -> None:
    trace.first_token_written_ns = time.time_ns()
    trace.close()


async def _whole(prep: Prepared, events: AsyncIterator[TokenEvent]) -> Response:
    got = [ev async for ev in events]
    if got and got[-1].finish_reason == "error":
        raise ApiError(500, got[-1].error or "engine error", code="engine_error")
    return JSONResponse(full_response(prep.reply, got))


async def _stream(prep: Prepared, events: AsyncIterator[TokenEvent]) -> AsyncIterator[str]:
    num_tokens, offsets, trace = 0, TextOffsets(), prep.trace
    try:
        async for ev in events:
            if ev.finish_reason == "error":
                yield _sse(ApiError(500, ev.error or "engine error", code="engine_error").body())
                break
            yield _sse(stream_chunk(prep.reply, ev, num_tokens == 0, offsets.next(ev.token_id)))
            if num_tokens == 0 and trace is not None:  # resumed once the server sent the chunk
                trace.first_token_written_ns = time.time_ns()
            num_tokens += 1
        else:
            if prep.include_usage:
                yield _sse(usage_chunk(prep.reply, num_tokens))
        yield "data: [DONE]\n\n"
    finally:
        if trace is not None:
            trace.close()
