"""One request to an OpenAI-compatible server, timed chunk by chunk as the bytes arrive (SSE)."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import time
from dataclasses import dataclass

import msgspec

from rooftop.bench import records as R
from rooftop.bench.http import Disconnected, HTTPError, Pool
from rooftop.bench.records import RequestRecord


class _Timing(msgspec.Struct):
    received_ns: int = 0
    sent_ns: int = 0


class _Delta(msgspec.Struct):
    content: str | None = None
    # a reasoning model's thinking, streamed apart from the answer by servers with a reasoning parser
    # (vLLM, SGLang: reasoning_content; some: reasoning): tokens all the same, so they time the stream
    reasoning_content: str | None = None
    reasoning: str | None = None


class _Message(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None
    delta: _Delta | None = None
    message: _Message | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None  # the chunk's tokens, where the request asked (vLLM's return_token_ids)


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _ErrorBody(msgspec.Struct):
    message: str | None = None
    type: str | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    rooftop_timing: _Timing | None = None
    error: _ErrorBody | str | None = None


_decode = msgspec.json.Decoder(_Chunk).decode


def build_payload(
    *, chat: bool, model: str, prompt: str, max_tokens: int, stream: bool, force_length: bool,
    extra: dict | None = None,
) -> dict:
    """The request body: output length forced with max_tokens plus ignore_eos/min_tokens."""
    body: dict = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        # continuous_usage_stats (vLLM, SGLang): usage in every chunk, whose growth says how many tokens each
        # chunk carried (several under speculative decoding); a server that does not know it ignores it
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if force_length:
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    if extra:
        body.update(extra)
    return body


class _Sink:
    """Receives the response as the bytes arrive and fills the record; SSE lines stamped on arrival."""

    __slots__ = ("rec", "chat", "stream", "buf", "body", "pieces", "done", "stream_error", "usage_tokens")

    def __init__(self, rec: RequestRecord, chat: bool, stream: bool):
        self.rec, self.chat, self.stream = rec, chat, stream
        self.buf = b""
        self.body = b""
        self.pieces: list[str] = []
        self.done = False
        self.stream_error: str | None = None
        self.usage_tokens = 0  # completion tokens the stream's usage has counted so far

    def on_head(self, status: int, headers: dict, now_ns: int) -> None:
        self.rec.first_byte_ns = now_ns
        self.rec.http_status = status
        if status >= 400:
            self.stream = False

    def on_body(self, data: bytes, now_ns: int) -> None:
        if not self.stream:
            self.body += data
            return
        self.buf += data
        while (i := self.buf.find(b"\n")) >= 0:
            line, self.buf = self.buf[:i], self.buf[i + 1:]
            if line.startswith(b"data:"):
                self._event(line[5:].strip(), now_ns)

    def on_end(self, now_ns: int) -> None:
        self.rec.end_ns = now_ns

    def _event(self, data: bytes, now_ns: int) -> None:
        if data == b"[DONE]":
            self.done = True
            return
        chunk = _decode(data)
        rec = self.rec
        if chunk.error is not None and self.stream_error is None:
            err = chunk.error
            self.stream_error = err if isinstance(err, str) else (err.message or err.type or "error event")
        counted = self._tokens_in(chunk)
        if chunk.usage is not None:
            rec.prompt_tokens_server = chunk.usage.prompt_tokens
            rec.completion_tokens_server = chunk.usage.completion_tokens
        said = thought = False
        for choice in chunk.choices:
            if self.chat:
                d = choice.delta
                text = d.content if d else None
                thought = thought or bool(d and (d.reasoning_content or d.reasoning))
            else:
                text = choice.text
            if text:
                said = True
                self.pieces.append(text)  # the answer: what the quality check compares
            if choice.finish_reason:
                rec.finish_reason = choice.finish_reason
        # A chunk carries tokens by the server's own count where it gives one, else by carrying text: one
        # token then, the most a client can tell (a byte-level tokenizer may hold a token's text back).
        tokens = counted if counted is not None else int(said or thought)
        if said and rec.first_content_ns is None:
            rec.first_content_ns = now_ns
        if tokens <= 0:
            return
        if thought:
            rec.reasoning_tokens += tokens
        rec.chunk_ns.append(now_ns)
        rec.chunk_tokens.append(tokens)
        if chunk.rooftop_timing is not None:
            rec.server_received_ns = chunk.rooftop_timing.received_ns
            rec.server_sent_ns.append(chunk.rooftop_timing.sent_ns)

    def _tokens_in(self, chunk: _Chunk) -> int | None:
        """Output tokens a chunk carries by the server's count: its choices' token_ids, else the growth of the
        usage it carries along (stream_options.continuous_usage_stats); None where it says neither."""
        if any(c.token_ids is not None for c in chunk.choices):
            return sum(len(c.token_ids or ()) for c in chunk.choices)
        if chunk.usage is None or chunk.usage.completion_tokens is None or not chunk.choices:
            return None  # the closing usage-only chunk carries no token
        grown = chunk.usage.completion_tokens - self.usage_tokens
        self.usage_tokens = chunk.usage.completion_tokens
        return grown

    def finish(self) -> None:
        """After the response ended: decide ok or error from what came."""
        rec = self.rec
        if rec.http_status is not None and rec.http_status >= 400:
            rec.error_class = R.ERR_HTTP_4XX if rec.http_status < 500 else R.ERR_HTTP_5XX
            rec.error = f"HTTP {rec.http_status}: {self.body[:300].decode('utf-8', 'replace')}"
            return
        if self.stream:
            rec.output_text = "".join(self.pieces)
            if self.stream_error is not None:
                rec.error_class, rec.error = R.ERR_STREAM, f"server error in stream: {self.stream_error}"[:300]
                return
            if not self.done and rec.finish_reason is None:
                rec.error_class, rec.error = R.ERR_INCOMPLETE, "stream ended without a finish_reason or [DONE]"
                return
        else:
            full = _decode(self.body)
            if full.usage is not None:
                rec.prompt_tokens_server = full.usage.prompt_tokens
                rec.completion_tokens_server = full.usage.completion_tokens
            if full.choices:
                c = full.choices[0]
                rec.output_text = ((c.message.content if c.message else None) if self.chat else c.text) or ""
                rec.finish_reason = c.finish_reason
            # Without a stream the whole answer is one chunk that arrives at the end: TTFT is its E2E
            # latency, and TPOT and ITL are undefined (metrics.tpot_ms, itl_ms).
            rec.streamed = False
            rec.chunk_ns = [rec.end_ns]
            rec.first_content_ns = rec.end_ns
            rec.chunk_tokens = [rec.output_tokens]
        rec.status = R.STATUS_OK


_OUT_OF_FILES = (errno.EMFILE, errno.ENFILE)
OUT_OF_FILES_HINT = ("the client ran out of file descriptors: raise the open-file limit (e.g. `ulimit -n 65536`) "
                     "or lower the load")


def _classify(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return R.ERR_TIMEOUT
    if isinstance(exc, ConnectionRefusedError):
        return R.ERR_CONNECT
    if isinstance(exc, Disconnected | ConnectionResetError | BrokenPipeError):
        return R.ERR_DISCONNECT
    if isinstance(exc, OSError) and exc.errno in _OUT_OF_FILES:
        return R.ERR_CLIENT  # this process ran out of file descriptors: nothing to do with the server
    if isinstance(exc, OSError):
        return R.ERR_CONNECT
    if isinstance(exc, msgspec.DecodeError | msgspec.ValidationError | HTTPError | UnicodeDecodeError):
        return R.ERR_BAD_STREAM
    return R.ERR_CLIENT


@dataclass(slots=True, frozen=True)
class Prepared:
    """A request body encoded ahead of time, and what its response will look like."""

    payload: bytes
    chat: bool
    stream: bool


def prepare(body: dict) -> Prepared:
    """Encode a body built by build_payload (a level encodes all of its bodies before its clock starts)."""
    return Prepared(json.dumps(body).encode(), "messages" in body, bool(body.get("stream")))


async def send(pool: Pool, url: str, request: Prepared, rec: RequestRecord, timeout_s: float,
               headers: dict[str, str] | None = None) -> None:
    """Send one request (with `headers` beside the usual ones, and X-Request-Id: `rec.request_id`, made here
    when empty) and fill `rec` in place; never raises except CancelledError."""
    sink = _Sink(rec, request.chat, request.stream)
    rec.request_id = rec.request_id or os.urandom(12).hex()  # the server's spans name it (bench/latency.py)
    headers = {**headers, "X-Request-Id": rec.request_id} if headers else {"X-Request-Id": rec.request_id}
    rec.sent_ns = time.perf_counter_ns()
    try:
        await pool.request(url, request.payload, sink.on_head, sink.on_body, sink.on_end, headers=headers,
                           timeout_s=timeout_s)
        if rec.end_ns is None:
            rec.end_ns = time.perf_counter_ns()
        sink.finish()
    except asyncio.CancelledError:
        rec.end_ns = time.perf_counter_ns()
        rec.status, rec.error_class, rec.error = R.STATUS_ERROR, R.ERR_CANCELLED, "run interrupted"
        raise
    except Exception as exc:  # noqa: BLE001 — every failure becomes a record, none escapes
        rec.end_ns = time.perf_counter_ns()
        rec.status = R.STATUS_ERROR
        rec.error_class = _classify(exc)
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
        if isinstance(exc, OSError) and exc.errno in _OUT_OF_FILES:
            rec.error = f"{OUT_OF_FILES_HINT} ({rec.error})"[:300]
