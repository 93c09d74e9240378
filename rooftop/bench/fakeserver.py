"""A synthetic OpenAI-compatible streaming server that emits tokens on a known schedule.

Chunk k of a request goes out --ttft-ms + k x --itl-ms after the request's bytes arrived, never
earlier; a server that has fallen behind (its CPUs are busy) catches up keeping at least 0.9 of
--itl-ms between two chunks of one stream. A chunk carries one token, or, with --chunk-tokens, several
(speculative decoding's verified drafts). It exists to calibrate the load generator (every chunk is
stamped with its own send time) and to stage failures in tests. Tokenizer: byte level, token ids are
the UTF-8 bytes of the text, so each generated ASCII letter is exactly one token.

It speaks just enough HTTP/1.1 on a bare asyncio protocol, not a web framework, because its own
cost is part of what calibration measures: a request's arrival is the kernel's receive time of its
bytes (stamped.py), and parsing a request costs ~20 µs instead of a framework's ~150 µs, so a burst
of 64 requests does not queue behind the server's own work.

    python -m rooftop.bench.fakeserver --port 0 --ttft-ms 20 --itl-ms 10
"""

import argparse
import asyncio
import contextlib
import json
import os
import socket
import time
from dataclasses import dataclass
from itertools import count

from rooftop.bench.stamped import StampedTransport
from rooftop.bench.subproc import die_with_parent

READY_LINE = "fakeserver ready on http://{host}:{port}"
DEFAULT_MAX_TOKENS = 16  # OpenAI's default when a request names none
MAX_MODEL_LEN = 1 << 20



@dataclass(slots=True)
class Schedule:
    """The server's behaviour: time to first token and inter-token gap in ms, usage skew, early stop."""

    ttft_ms: float = 20.0
    itl_ms: float = 10.0
    usage_skew: int = 0
    model: str = "fake"
    eos_after: int | None = None
    no_usage: bool = False  # never send usage, as some servers do not
    stop_after: int | None = None  # stop after this many tokens whatever ignore_eos/min_tokens ask (a server that ignores them)
    drop: frozenset[int] = frozenset()  # generation requests (1-based, in arrival order) whose connection is closed after the first token
    reasoning_tokens: int = 0  # chat: the first N tokens of each answer stream as reasoning_content (a reasoning model)
    # tokens a chunk after the first carries, cycled: (3, 1, 4) streams tokens 1, 3, 1, 4, 3, ... a chunk, each
    # chunk one --itl-ms after the last, as speculative decoding hands out a verified draft's tokens at once
    chunk_tokens: tuple[int, ...] = (1,)


class BadRequest(Exception):
    """A request the server refuses with HTTP 400 and an OpenAI-style error body."""


_ids = count()


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


def chunk_plan(n_tokens: int, pattern: tuple[int, ...]) -> list[int]:
    """Tokens in each chunk of a stream of `n_tokens`: one in the first (the prompt's step makes one), then
    `pattern` cycled, the last chunk cut to fit."""
    sizes, left = [1], n_tokens - 1
    while left > 0:
        sizes.append(min(pattern[(len(sizes) - 1) % len(pattern)], left))
        left -= sizes[-1]
    return sizes


class _Request:
    __slots__ = ("method", "path", "body", "received_ns")

    def __init__(self, method: str, path: str, body: bytes, received_ns: int):
        self.method, self.path, self.body, self.received_ns = method, path, body, received_ns


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 413: "Payload Too Large"}
MAX_BODY = 64 << 20


class _Connection:
    """One client connection: requests parsed from the bytes, answered one at a time (no pipelining)."""

    def __init__(self, server: "FakeServer"):
        self.server = server
        self.transport: StampedTransport | None = None
        self.buf = b""
        self.arrival_ns: int | None = None  # first byte of the request being received
        self.pending: list[tuple[bytes, int]] = []
        self.busy = False
        self.queue: list[_Request] = []

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.server.connections.add(self)

    def connection_lost(self, exc) -> None:
        self.server.connections.discard(self)

    def data_received_at(self, data: bytes, stamp_ns: int) -> None:
        # Parse a moment later, so every socket read in this loop turn is taken first.
        if not self.pending:
            asyncio.get_running_loop().call_soon(self._parse)
        self.pending.append((data, stamp_ns))

    def _parse(self) -> None:
        pending, self.pending = self.pending, []
        if self.transport.is_closing():
            return
        for data, now in pending:
            if not self.buf:
                self.arrival_ns = now
            self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            length = 0
            for line in lines[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip()) if v.strip().isdigit() else -1
            if len(parts) != 3 or length < 0 or length > MAX_BODY:
                self.reply(400, {"error": {"message": "malformed HTTP request", "type": "invalid_request_error"}},
                           close=True)
                return
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            req = _Request(parts[0], parts[1].split("?", 1)[0], body, self.arrival_ns or time.perf_counter_ns())
            self.arrival_ns = time.perf_counter_ns() if self.buf else None
            self.queue.append(req)
            self._next()

    def _next(self) -> None:
        if self.busy or not self.queue:
            return
        self.busy = True
        task = asyncio.get_running_loop().create_task(self.server.handle(self, self.queue.pop(0)))
        self.server.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.server.tasks.discard(task)
        self.busy = False
        if not task.cancelled() and task.exception() is not None and not self.transport.is_closing():
            self.reply(500, {"error": {"message": str(task.exception()), "type": "server_error"}}, close=True)
        self._next()

    def reply(self, status: int, obj: dict, close: bool = False) -> None:
        data = json.dumps(obj).encode()
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n")
        self.transport.write(head.encode() + data)
        if close:
            self.transport.close()

    def start_stream(self) -> None:
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")

    def write_chunk(self, data: bytes) -> None:
        self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self) -> None:
        self.transport.write(b"0\r\n\r\n")


def _error(status: int, message: str) -> tuple[int, dict]:
    return status, {"error": {"message": message, "type": "invalid_request_error", "code": status}}


def _json_body(req: _Request) -> dict:
    try:
        body = json.loads(req.body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest("request body is not valid JSON") from exc
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


class FakeServer:
    """Request handlers bound to one Schedule, and the connections and tasks they serve."""

    def __init__(self, schedule: Schedule):
        self.s = schedule
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task] = set()
        self.generated = 0  # generation requests received
        self.routes = {
            ("GET", "/health"): self.health, ("GET", "/v1/models"): self.models,
            ("POST", "/tokenize"): self.tokenize, ("POST", "/detokenize"): self.detokenize,
            ("POST", "/v1/completions"): self.completions, ("POST", "/v1/chat/completions"): self.chat_completions,
        }

    async def handle(self, conn: _Connection, req: _Request) -> None:
        route = self.routes.get((req.method, req.path))
        if route is None:
            known = any(path == req.path for _, path in self.routes)
            conn.reply(*_error(405 if known else 404, f"{req.method} {req.path} is not served here"))
            return
        try:
            result = await route(conn, req)
        except BadRequest as exc:
            result = _error(400, str(exc))
        if result is not None:
            conn.reply(*result)

    async def health(self, conn, req):
        return 200, {"status": "ok"}

    async def models(self, conn, req):
        card = {"id": self.s.model, "object": "model", "created": 0, "owned_by": "rooftop",
                "max_model_len": MAX_MODEL_LEN}
        return 200, {"object": "list", "data": [card]}

    async def tokenize(self, conn, req):
        body = _json_body(req)
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
        return 200, {"tokens": tokens, "count": len(tokens), "max_model_len": MAX_MODEL_LEN}

    async def detokenize(self, conn, req):
        tokens = _json_body(req).get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and 0 <= t < 256 for t in tokens):
            return _error(400, "'tokens' must be a list of byte ids 0..255")
        return 200, {"prompt": bytes(tokens).decode("utf-8", errors="replace")}

    async def completions(self, conn, req):
        return await self._generate(conn, req, chat=False)

    async def chat_completions(self, conn, req):
        return await self._generate(conn, req, chat=True)

    async def _generate(self, conn: _Connection, req: _Request, chat: bool):
        # The schedule runs from the moment the request's bytes were read (stamped before parsing).
        received_ns = req.received_ns
        body = _json_body(req)
        prompt_tokens = prompt_token_count(body, chat)
        n_tokens, finish_reason = output_plan(body, self.s.eos_after)
        if self.s.stop_after is not None and n_tokens > self.s.stop_after:
            n_tokens, finish_reason = max(1, self.s.stop_after), "stop"
        self.generated += 1
        drop = self.generated in self.s.drop
        ttft_ns = round(self.s.ttft_ms * 1e6)
        itl_ns = round(self.s.itl_ms * 1e6)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n_tokens + self.s.usage_skew,
                 "total_tokens": prompt_tokens + n_tokens + self.s.usage_skew}
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{next(_ids)}"
        created = int(time.time())
        if not body.get("stream"):
            await _sleep_until(received_ns + ttft_ns + (len(chunk_plan(n_tokens, self.s.chunk_tokens)) - 1) * itl_ns)
            text = "".join(_token(i) for i in range(n_tokens))
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": text},
                          "finish_reason": finish_reason}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            return 200, {
                "id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": self.s.model, "choices": [choice], **({} if self.s.no_usage else {"usage": usage}),
                "rooftop_timing": {"received_ns": received_ns, "sent_ns": time.perf_counter_ns()},
            }

        await self._stream(conn, body, chat, rid, created, received_ns, n_tokens, finish_reason, usage, drop)
        return None

    async def _stream(self, conn: _Connection, body: dict, chat: bool, rid: str, created: int, received_ns: int,
                      n_tokens: int, finish_reason: str, usage: dict, drop: bool) -> None:
        """Stream `n_tokens` in chunks of Schedule.chunk_tokens, each chunk on its time; usage in every chunk where
        stream_options.continuous_usage_stats asks (its completion_tokens the tokens sent so far), each chunk's
        token ids where return_token_ids does, the whole usage after the last when include_usage does."""
        conn.start_stream()
        # The constant parts of every chunk are built once; only the tokens and stamps vary per chunk.
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = (f'data: {{"id":"{rid}","object":"{obj}","created":{created},'
                f'"model":{json.dumps(self.s.model)},"choices":[{{"index":0,')
        timing = f'"rooftop_timing":{{"received_ns":{received_ns},"sent_ns":'
        stream_options = body.get("stream_options") or {}
        include_usage = bool(stream_options.get("include_usage")) and not self.s.no_usage
        continuous = include_usage and bool(stream_options.get("continuous_usage_stats"))
        ids = bool(body.get("return_token_ids"))
        prompt_tokens = usage["prompt_tokens"]
        ttft_ns, itl_ns = round(self.s.ttft_ms * 1e6), round(self.s.itl_ms * 1e6)
        due_ns = received_ns + ttft_ns
        first = 0
        for k, size in enumerate(chunk_plan(n_tokens, self.s.chunk_tokens)):
            await _sleep_until(due_ns)
            if conn.transport.is_closing():
                return  # the client went away mid-stream: nothing more to send
            sent = first + size
            text = "".join(_token(i) for i in range(first, sent))
            reason = f'"{finish_reason}"' if sent == n_tokens else "null"
            token_ids = f',"token_ids":[{",".join(str(ord(c)) for c in text)}]' if ids else ""
            if chat:
                role = '"role":"assistant",' if k == 0 else ""
                kind = "reasoning_content" if first < self.s.reasoning_tokens else "content"
                choice = f'"delta":{{{role}"{kind}":"{text}"}},"logprobs":null,"finish_reason":{reason}{token_ids}'
            else:
                choice = f'"text":"{text}","logprobs":null,"finish_reason":{reason}{token_ids}'
            so_far = (f'"usage":{{"prompt_tokens":{prompt_tokens},"completion_tokens":{sent},'
                      f'"total_tokens":{prompt_tokens + sent}}},') if continuous else ""
            sent_ns = time.perf_counter_ns()
            conn.write_chunk(f"{head}{choice}}}],{so_far}{timing}{sent_ns}}}}}\n\n".encode())
            if drop:  # a dropped connection mid-stream (a proxy's idle cut, a worker restart)
                conn.transport.close()
                return
            # Behind its schedule, the server does not send the chunks it owes back to back: a stream's
            # chunks stay at least 0.9 of a gap apart, as an engine's do (one chunk a stream a step, and a
            # late step is a long one). On schedule the floor never binds (a timer wakes well within a
            # tenth of a gap), so timer wake-up delays do not add up chunk after chunk.
            due_ns = max(received_ns + ttft_ns + (k + 1) * itl_ns, sent_ns + itl_ns * 9 // 10)
            first = sent
        if include_usage:
            chunk = {"id": rid, "object": obj, "created": created, "model": self.s.model, "choices": [],
                     "usage": usage, "rooftop_timing": {"received_ns": received_ns, "sent_ns": time.perf_counter_ns()}}
            conn.write_chunk(f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode())
        conn.write_chunk(b"data: [DONE]\n\n")
        conn.end_stream()


class FakeServerHandle:
    """A running synthetic server: its port, and `cleanup()` to stop it."""

    def __init__(self, fake: FakeServer, listener: socket.socket, loop: asyncio.AbstractEventLoop):
        self.fake, self.listener, self.loop = fake, listener, loop
        self.port = listener.getsockname()[1]

    async def cleanup(self) -> None:
        self.loop.remove_reader(self.listener.fileno())
        self.listener.close()
        for task in list(self.fake.tasks):
            task.cancel()
        for conn in list(self.fake.connections):
            conn.transport.close()
        await asyncio.sleep(0)


async def start_fake_server(host: str = "127.0.0.1", port: int = 0, *, ttft_ms: float = 20.0,
                            itl_ms: float = 10.0, usage_skew: int = 0, model: str = "fake",
                            eos_after: int | None = None, no_usage: bool = False, stop_after: int | None = None,
                            drop: frozenset[int] = frozenset(), reasoning_tokens: int = 0,
                            chunk_tokens: tuple[int, ...] = (1,)) -> tuple[FakeServerHandle, int]:
    """Start the server in the running event loop; returns (handle, bound port). Stop with handle.cleanup()."""
    fake = FakeServer(Schedule(ttft_ms=ttft_ms, itl_ms=itl_ms, usage_skew=usage_skew, model=model,
                               eos_after=eos_after, no_usage=no_usage, stop_after=stop_after, drop=drop,
                               reasoning_tokens=reasoning_tokens, chunk_tokens=chunk_tokens))
    loop = asyncio.get_running_loop()
    # A deep accept backlog: calibration opens hundreds of connections at once.
    listener = socket.create_server((host, port), backlog=4096)
    listener.setblocking(False)

    def accept_ready() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(fake)
            conn.connection_made(StampedTransport(loop, sock, conn))

    loop.add_reader(listener.fileno(), accept_ready)
    handle = FakeServerHandle(fake, listener, loop)
    return handle, handle.port


def lower_priority(nice: int) -> None:
    """Lower this process's CPU priority by `nice`. On Linux with autogroup scheduling a process started
    in a session of its own is weighed against the others as a group of its own, whatever its nice
    value, so the group's nice is lowered as well (/proc/self/autogroup)."""
    os.nice(nice)
    autogroup = "/proc/self/autogroup"
    if os.path.exists(autogroup):
        with contextlib.suppress(OSError), open(autogroup, "w") as f:
            f.write(str(min(nice, 19)))


async def _serve_forever(args: argparse.Namespace) -> None:
    runner, port = await start_fake_server(args.host, args.port, ttft_ms=args.ttft_ms, itl_ms=args.itl_ms,
                                           usage_skew=args.usage_skew, model=args.model,
                                           eos_after=args.eos_after, no_usage=args.no_usage,
                                           stop_after=args.stop_after,
                                           drop=frozenset(int(x) for x in args.drop.split(",") if x.strip()),
                                           reasoning_tokens=args.reasoning_tokens,
                                           chunk_tokens=tuple(int(x) for x in args.chunk_tokens.split(",")))
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
    parser.add_argument("--no-usage", action="store_true", help="never send usage")
    parser.add_argument("--stop-after", type=int, default=None,
                        help="stop after N tokens whatever ignore_eos/min_tokens ask (a server that ignores them)")
    parser.add_argument("--drop", default="", help="close the connection of these generation requests (1-based, "
                                                   "comma-separated) after their first token")
    parser.add_argument("--reasoning-tokens", type=int, default=0,
                        help="chat: stream the first N tokens of each answer as reasoning_content")
    parser.add_argument("--chunk-tokens", default="1",
                        help="tokens each chunk after the first carries, comma-separated and cycled (e.g. 3,1,4: "
                             "speculative decoding's verified drafts); each chunk comes --itl-ms after the last")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="exit when this process ends (Linux), so a killed caller leaves no server behind")
    parser.add_argument("--nice", type=int, default=0,
                        help="run at this much lower CPU priority (calibration: the client under test comes first)")
    args = parser.parse_args(argv)
    if args.nice > 0:
        lower_priority(args.nice)
    if args.parent_pid is not None:
        die_with_parent(args.parent_pid)
    try:
        asyncio.run(_serve_forever(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
