"""A synthetic OpenAI-compatible streaming server that emits tokens on a known schedule.

It exists to calibrate the load generator (every chunk is stamped with its own send time) and to
stage failures in tests. Tokenizer: byte level, token ids are the UTF-8 bytes of the text, so each
generated ASCII letter is exactly one token.

    python -m rooftop.bench.fakeserver --port 0 --ttft-ms 20 --itl-ms 10
"""

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from itertools import count

from aiohttp import web

READY_LINE = "fakeserver ready on http://{host}:{port}"
DEFAULT_MAX_TOKENS = 16  # OpenAI's default when a request names none
MAX_MODEL_LEN = 1 << 20

# transport -> perf_counter_ns when the first bytes of its current request arrived.
_ARRIVALS: dict = {}
_RECEIVED_NS = web.RequestKey("received_ns", int)


@dataclass(slots=True)
class Schedule:
    """The server's behaviour: time to first token and inter-token gap in ms, usage skew, early stop."""

    ttft_ms: float = 20.0
    itl_ms: float = 10.0
    usage_skew: int = 0
    model: str = "fake"
    eos_after: int | None = None


class BadRequest(Exception):
    """A request the server refuses with HTTP 400 and an OpenAI-style error body."""


_ids = count()


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": status}}
    return web.json_response(body, status=status)


def _text_of_content(content) -> str:
    """Text of a chat message content: a string, or a list of {"type": "text", "text": ...} parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    raise BadRequest("message content must be a string or a list of text parts")


def prompt_token_count(body: dict, chat: bool) -> int:
    """Number of byte-level tokens in a request's prompt (chat: the concatenated message contents)."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        return sum(len(_text_of_content(m.get("content")).encode()) for m in messages)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt.encode())
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return len(prompt[0].encode())
    raise BadRequest("'prompt' must be a string, a list of token ids, or a list of one string")


def output_plan(body: dict, eos_after: int | None) -> tuple[int, str]:
    """(tokens to produce, finish_reason) for a request, honouring max_tokens, ignore_eos, min_tokens."""
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens", DEFAULT_MAX_TOKENS))
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadRequest(f"'max_tokens' must be a positive integer, got {max_tokens!r}")
    min_tokens = body.get("min_tokens") or 0
    if not isinstance(min_tokens, int) or min_tokens < 0:
        raise BadRequest(f"'min_tokens' must be a non-negative integer, got {min_tokens!r}")
    if eos_after is None or body.get("ignore_eos"):
        return max_tokens, "length"
    stop_at = max(eos_after, min_tokens)
    if stop_at >= max_tokens:
        return max_tokens, "length"
    return max(stop_at, 1), "stop"


async def _sleep_until(target_ns: int) -> None:
    """Sleep until perf_counter_ns() >= target_ns: the schedule is a floor, never early."""
    while (remaining_ns := target_ns - time.perf_counter_ns()) > 0:
        await asyncio.sleep(remaining_ns / 1e9)


def _token(i: int) -> str:
    return chr(97 + i % 26)


class FakeServer:
    """Request handlers bound to one Schedule."""

    def __init__(self, schedule: Schedule):
        self.s = schedule

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.s.model, "object": "model", "created": 0, "owned_by": "rooftop",
                "max_model_len": MAX_MODEL_LEN}
        return web.json_response({"object": "list", "data": [card]})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        if "messages" in body:
            try:
                text = "".join(_text_of_content(m.get("content")) for m in body["messages"])
            except (BadRequest, AttributeError, TypeError):
                return _error(400, "'messages' must be a list of {role, content}")
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            return _error(400, "'prompt' must be a string")
        tokens = list(text.encode())
        return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": MAX_MODEL_LEN})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and 0 <= t < 256 for t in tokens):
            return _error(400, "'tokens' must be a list of byte ids 0..255")
        return web.json_response({"prompt": bytes(tokens).decode("utf-8", errors="replace")})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        # The schedule runs from the moment the request's bytes reached the server process (stamped
        # in data_received), so the server's own parsing and queueing are never blamed on the client.
        received_ns = request[_RECEIVED_NS]
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        try:
            prompt_tokens = prompt_token_count(body, chat)
            n_tokens, finish_reason = output_plan(body, self.s.eos_after)
        except BadRequest as exc:
            return _error(400, str(exc))
        ttft_ns = round(self.s.ttft_ms * 1e6)
        itl_ns = round(self.s.itl_ms * 1e6)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n_tokens + self.s.usage_skew,
                 "total_tokens": prompt_tokens + n_tokens + self.s.usage_skew}
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{next(_ids)}"
        created = int(time.time())
        if not body.get("stream"):
            await _sleep_until(received_ns + ttft_ns + (n_tokens - 1) * itl_ns)
            text = "".join(_token(i) for i in range(n_tokens))
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": text},
                          "finish_reason": finish_reason}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            return web.json_response({
                "id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": self.s.model, "choices": [choice], "usage": usage,
                "rooftop_timing": {"received_ns": received_ns, "sent_ns": time.perf_counter_ns()},
            })

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        # The constant parts of every chunk are built once; only the token and stamps vary per chunk.
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = (f'data: {{"id":"{rid}","object":"{obj}","created":{created},'
                f'"model":{json.dumps(self.s.model)},"choices":[{{"index":0,')
        timing = f'"rooftop_timing":{{"received_ns":{received_ns},"sent_ns":'
        stream_options = body.get("stream_options") or {}
        try:
            for i in range(n_tokens):
                await _sleep_until(received_ns + ttft_ns + i * itl_ns)
                reason = f'"{finish_reason}"' if i == n_tokens - 1 else "null"
                if chat:
                    role = '"role":"assistant",' if i == 0 else ""
                    choice = f'"delta":{{{role}"content":"{_token(i)}"}},"logprobs":null,"finish_reason":{reason}'
                else:
                    choice = f'"text":"{_token(i)}","logprobs":null,"finish_reason":{reason}'
                await resp.write(f"{head}{choice}}}],{timing}{time.perf_counter_ns()}}}}}\n\n".encode())
            if stream_options.get("include_usage"):
                chunk = {"id": rid, "object": obj, "created": created, "model": self.s.model, "choices": [],
                         "usage": usage,
                         "rooftop_timing": {"received_ns": received_ns, "sent_ns": time.perf_counter_ns()}}
                await resp.write(f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionError:
            pass  # the client went away mid-stream: nothing more to send
        return resp


async def _json_body(request: web.Request) -> dict | web.Response:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "request body is not valid JSON")
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object")
    return body


@web.middleware
async def _take_arrival(request: web.Request, handler):
    """Every request takes its connection's arrival stamp, so none is left for the next one."""
    request[_RECEIVED_NS] = _ARRIVALS.pop(request.transport, None) or time.perf_counter_ns()
    return await handler(request)


def make_app(schedule: Schedule) -> web.Application:
    """The aiohttp application serving health, models, tokenize/detokenize and (chat) completions."""
    server = FakeServer(schedule)
    app = web.Application(middlewares=[_take_arrival])
    app.router.add_get("/health", server.health)
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/v1/completions", server.completions)
    app.router.add_post("/v1/chat/completions", server.chat_completions)
    app.router.add_post("/tokenize", server.tokenize)
    app.router.add_post("/detokenize", server.detokenize)
    return app




class _ArrivalStamp(asyncio.Protocol):
    """Stands in front of aiohttp's request handler and stamps each request's first bytes on arrival."""

    def __init__(self, inner: asyncio.Protocol):
        self.inner = inner
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        # One request at a time per connection (no pipelining): the first bytes after the previous
        # request was taken are the next request's arrival.
        _ARRIVALS.setdefault(self.transport, time.perf_counter_ns())
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received()

    def connection_lost(self, exc) -> None:
        _ARRIVALS.pop(self.transport, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class FakeServerHandle:
    """A running synthetic server: its port, and `cleanup()` to stop it."""

    def __init__(self, runner: web.AppRunner, server: asyncio.AbstractServer):
        self.runner, self.server = runner, server
        self.port = server.sockets[0].getsockname()[1]

    async def cleanup(self) -> None:
        self.server.close()
        await self.runner.cleanup()


async def start_fake_server(host: str = "127.0.0.1", port: int = 0, *, ttft_ms: float = 20.0,
                            itl_ms: float = 10.0, usage_skew: int = 0, model: str = "fake",
                            eos_after: int | None = None) -> tuple[FakeServerHandle, int]:
    """Start the server in the running event loop; returns (handle, bound port). Stop with handle.cleanup()."""
    schedule = Schedule(ttft_ms=ttft_ms, itl_ms=itl_ms, usage_skew=usage_skew, model=model, eos_after=eos_after)
    runner = web.AppRunner(make_app(schedule), access_log=None, handle_signals=False)
    await runner.setup()
    web_server = runner.server
    loop = asyncio.get_running_loop()
    # A deep accept backlog: calibration opens hundreds of connections at once.
    server = await loop.create_server(lambda: _ArrivalStamp(web_server()), host, port, backlog=4096)
    handle = FakeServerHandle(runner, server)
    return handle, handle.port


async def _serve_forever(args: argparse.Namespace) -> None:
    runner, port = await start_fake_server(args.host, args.port, ttft_ms=args.ttft_ms, itl_ms=args.itl_ms,
                                           usage_skew=args.usage_skew, model=args.model,
                                           eos_after=args.eos_after)
    print(READY_LINE.format(host=args.host, port=port), flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    """Command-line entry: parse flags, serve until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m rooftop.bench.fakeserver", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on the ready line)")
    parser.add_argument("--ttft-ms", type=float, default=20.0, help="time from request receipt to first token")
    parser.add_argument("--itl-ms", type=float, default=10.0, help="gap between consecutive tokens")
    parser.add_argument("--usage-skew", type=int, default=0, help="added to usage.completion_tokens")
    parser.add_argument("--model", default="fake")
    parser.add_argument("--eos-after", type=int, default=None,
                        help="stop with finish_reason 'stop' after N tokens unless ignore_eos/min_tokens forbid")
    args = parser.parse_args(argv)
    try:
        asyncio.run(_serve_forever(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
