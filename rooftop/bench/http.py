"""A small HTTP/1.1 client for the load path, on asyncio protocols.

Why not aiohttp here: getting one request onto the wire through aiohttp costs ~170 µs of Python on
these machines against ~18 µs for a plain asyncio transport (benchmarks/http_client_overhead.py). At
concurrency 64, requests that leave together queue behind each other in the client, and that queue
lands in TTFT. This client does only what a benchmark needs — POST a JSON body, keep connections
alive, read Content-Length or chunked bodies — and stamps every byte's arrival with the kernel's
receive time (stamped.py), so bytes that wait for a busy event loop are still timed when they
arrived. aiohttp still does the control calls (/v1/models, /tokenize).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from rooftop.bench.stamped import StampedTransport


class HTTPError(Exception):
    """The server sent something that is not HTTP/1.1."""


class Disconnected(ConnectionError):
    """The server closed the connection before the response ended."""


class ResponseParser:
    """Incremental HTTP/1.1 response parser: head, then a Content-Length, chunked or until-close body.

    `on_head(status, headers, now_ns)`, `on_body(bytes, now_ns)` and `on_end(now_ns)` are called as
    soon as the bytes that complete each part are fed.
    """

    def __init__(self, on_head: Callable, on_body: Callable, on_end: Callable):
        self.on_head, self.on_body, self.on_end = on_head, on_body, on_end
        self.buf = b""
        self.state = "head"
        self.remaining = 0  # bytes left in the body (content-length) or the current chunk
        self.keep_alive = True
        self.done = False

    def feed(self, data: bytes, now_ns: int) -> None:
        self.buf += data
        while not self.done:
            if self.state == "head":
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                self._head(self.buf[:end], now_ns)
                self.buf = self.buf[end + 4:]
            elif self.state == "length":
                if not self.buf:
                    return
                take = self.buf[: self.remaining]
                self.buf = self.buf[len(take):]
                self.remaining -= len(take)
                self.on_body(take, now_ns)
                if self.remaining == 0:
                    self._finish(now_ns)
            elif self.state == "chunk-size":
                end = self.buf.find(b"\r\n")
                if end < 0:
                    return
                try:
                    size = int(self.buf[:end].split(b";", 1)[0], 16)
                except ValueError as exc:
                    raise HTTPError(f"bad chunk size {self.buf[:end][:40]!r}") from exc
                self.buf = self.buf[end + 2:]
                self.remaining = size
                self.state = "chunk-data" if size else "trailer"
            elif self.state == "chunk-data":
                if len(self.buf) < self.remaining + 2:
                    if self.buf and len(self.buf) <= self.remaining:
                        # Hand over what is here now: an SSE line must be stamped when it arrives.
                        take, self.buf = self.buf, b""
                        self.remaining -= len(take)
                        self.on_body(take, now_ns)
                    return
                take = self.buf[: self.remaining]
                if self.buf[self.remaining:self.remaining + 2] != b"\r\n":
                    raise HTTPError("chunk data not followed by CRLF: bad chunk size")
                self.buf = self.buf[self.remaining + 2:]
                self.remaining = 0
                self.state = "chunk-size"
                if take:
                    self.on_body(take, now_ns)
            elif self.state == "trailer":
                end = self.buf.find(b"\r\n")
                if end < 0:
                    return
                line, self.buf = self.buf[:end], self.buf[end + 2:]
                if not line:
                    self._finish(now_ns)
            elif self.state == "until-close":
                if self.buf:
                    take, self.buf = self.buf, b""
                    self.on_body(take, now_ns)
                return

    def _head(self, head: bytes, now_ns: int) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise HTTPError(f"not an HTTP/1.x response: {lines[0][:60]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            headers[k.strip().lower().decode("latin-1")] = v.strip().decode("latin-1")
        self.keep_alive = headers.get("connection", "").lower() != "close" and parts[0] == b"HTTP/1.1"
        self.on_head(status, headers, now_ns)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.state = "chunk-size"
        elif "content-length" in headers:
            self.remaining = int(headers["content-length"])
            self.state = "length"
            if self.remaining == 0:
                self._finish(now_ns)
        else:
            self.state = "until-close"
            self.keep_alive = False

    def _finish(self, now_ns: int) -> None:
        self.done = True
        self.on_end(now_ns)

    def connection_closed(self, now_ns: int) -> bool:
        """The peer closed: True when that legitimately ended an until-close body."""
        if self.state == "until-close" and not self.done:
            self._finish(now_ns)
            return True
        return self.done


# How long the parser holds the event loop at a time before the sockets are read again.
PARSE_SLICE_NS = 500_000


class _ParseQueue:
    """Connections whose bytes are read but not yet parsed: every socket ready in a loop turn is read
    before any of them is parsed.

    A read's stamp is the kernel's receive time, so parsing later moves no stamp. What a late read
    costs is accuracy: a stream's next token that lands before its last one was read joins it under
    the newer stamp (stamped.py). An engine sends every stream's token in one burst a step; reading
    the burst's sockets first (~4 µs each) and parsing after (~10 µs each) drains 512 streams in ~2 ms
    where reading and parsing in turn took ~9 ms, about one token gap at 10 ms. Where kernel stamps are
    missing, a read is stamped when it is made, and parsing later keeps one stream's parsing out of
    the next stream's stamps all the same."""

    __slots__ = ("conns",)

    def __init__(self):
        self.conns: list[_Conn] = []

    def add(self, conn: _Conn) -> None:
        if not self.conns:
            asyncio.get_running_loop().call_soon(self.run)
        self.conns.append(conn)

    def run(self) -> None:
        """Parse for at most PARSE_SLICE_NS, then let the loop read what has come meanwhile (the
        requests that parsing ends resume in the same turn: a slice also bounds their work)."""
        conns = self.conns
        deadline = time.perf_counter_ns() + PARSE_SLICE_NS
        done = 0
        for conn in conns:
            conn._process()
            done += 1
            if time.perf_counter_ns() >= deadline:
                break
        del conns[:done]
        if conns:
            asyncio.get_running_loop().call_soon(self.run)


class _Conn:
    """One keep-alive connection. Bytes come stamped with their kernel receive time (or their read's
    time) and are parsed once every socket ready in that loop turn has been read (_ParseQueue)."""

    def __init__(self, parse_queue: _ParseQueue):
        self.parse_queue = parse_queue
        self.transport: StampedTransport | None = None
        self.parser: ResponseParser | None = None
        self.waiter: asyncio.Future | None = None
        self.closed = False
        self.got_bytes = False
        self._pending: list[tuple[bytes, int]] = []

    def data_received_at(self, data: bytes, now: int) -> None:
        self.got_bytes = True
        self._pending.append((data, now))
        if len(self._pending) == 1:
            self.parse_queue.add(self)

    def _process(self) -> None:
        pending, self._pending = self._pending, []
        if self.parser is None or self.parser.done:
            return
        try:
            for data, now in pending:
                self.parser.feed(data, now)
                if self.parser.done:
                    break
        except Exception as exc:  # noqa: BLE001 — a parse or sink error ends this request, not the loop
            self._resolve(exc)
            self.transport.close()
            return
        if self.parser.done:
            self._resolve(None)

    def connection_lost(self, exc) -> None:
        self._process()  # bytes that arrived before the close still count
        self.closed = True
        now = time.perf_counter_ns()
        if self.parser is not None and not self.parser.done:
            ended = self.parser.connection_closed(now)
            self._resolve(None if ended else Disconnected("server closed the connection mid-response"))

    def expire(self) -> None:
        """The request's time is up: it fails with TimeoutError (the caller drops the connection)."""
        self._resolve(TimeoutError("no complete response within the request's timeout"))

    def _resolve(self, exc: BaseException | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            if exc is None:
                self.waiter.set_result(None)
            else:
                self.waiter.set_exception(exc)


class Pool:
    """Keep-alive connections per (host, port); one request at a time on each."""

    def __init__(self):
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._all: set[_Conn] = set()
        self._addrs: dict[tuple[str, int], list] = {}
        self._urls: dict[str, tuple[str, int, str]] = {}  # url -> host, port, path
        self._parse_queue = _ParseQueue()

    async def _connect(self, host: str, port: int) -> _Conn:
        loop = asyncio.get_running_loop()
        # Resolved once per host: the resolver runs in a thread, and a level opens hundreds of connections.
        if (host, port) not in self._addrs:
            self._addrs[host, port] = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        last: OSError = OSError(f"cannot resolve {host}")
        for family, kind, proto, _, addr in self._addrs[host, port]:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, addr)
            except BaseException as exc:
                sock.close()
                if not isinstance(exc, OSError):
                    raise
                last = exc
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(self._parse_queue)
            conn.transport = StampedTransport(loop, sock, conn)
            self._all.add(conn)
            return conn
        raise last

    async def prewarm(self, url: str, n: int) -> None:
        """Open connections until `n` are idle for url's host, so a level's first requests do not
        pay for TCP set-up (a long benchmark reuses its connections; neither should a short one)."""
        u = urlsplit(url)
        key = (u.hostname or "127.0.0.1", u.port or 80)
        idle = self._idle.setdefault(key, [])
        idle[:] = [c for c in idle if not c.closed]
        missing = n - len(idle)
        if missing > 0:
            idle.extend(await asyncio.gather(*(self._connect(*key) for _ in range(missing))))

    async def request(
        self, url: str, body: bytes, on_head: Callable, on_body: Callable, on_end: Callable,
        headers: dict[str, str] | None = None, timeout_s: float | None = None,
    ) -> None:
        """POST `body` (JSON) to `url`; the callbacks see the response as it arrives. Past `timeout_s`
        it raises TimeoutError (one timer on the exchange: asyncio.timeout costs ~6 µs a request, and a
        level sends its requests in bursts)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        if url not in self._urls:
            u = urlsplit(url)
            if u.scheme != "http":
                raise HTTPError(f"only http:// URLs are supported by the load client, not {url}")
            self._urls[url] = (u.hostname or "127.0.0.1", u.port or 80, (u.path or "/") + (f"?{u.query}" if u.query else ""))
        host, port, path = self._urls[url]
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream, application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
        ).encode("latin-1")
        key = (host, port)
        idle = self._idle.setdefault(key, [])
        while idle:
            conn = idle.pop()
            if not conn.closed:
                break
        else:
            conn = None
        reused = conn is not None
        if conn is None:
            conn = await self._connect_by(host, port, deadline)
        try:
            try:
                await self._exchange(conn, head + body, on_head, on_body, on_end, deadline)
            except Disconnected:
                if not (reused and not conn.got_bytes):
                    raise
                # A kept-alive connection the server had already closed: once more on a fresh one.
                self._drop(conn)
                conn = await self._connect_by(host, port, deadline)
                await self._exchange(conn, head + body, on_head, on_body, on_end, deadline)
        except BaseException:
            self._drop(conn)
            raise
        if conn.parser.keep_alive and not conn.closed:
            conn.parser = None
            idle.append(conn)
        else:
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        if conn.transport is not None:
            conn.transport.close()
        self._all.discard(conn)

    async def _connect_by(self, host: str, port: int, deadline: float | None) -> _Conn:
        if deadline is None:
            return await self._connect(host, port)
        return await asyncio.wait_for(self._connect(host, port), max(0.0, deadline - asyncio.get_running_loop().time()))

    async def _exchange(self, conn: _Conn, data: bytes, on_head, on_body, on_end, deadline: float | None) -> None:
        loop = asyncio.get_running_loop()
        conn.got_bytes = False
        conn.parser = ResponseParser(on_head, on_body, on_end)
        conn.waiter = loop.create_future()
        if conn.closed:
            raise Disconnected("connection closed before the request was sent")
        timer = None if deadline is None else loop.call_at(deadline, conn.expire)
        conn.transport.write(data)
        try:
            await conn.waiter
        finally:
            if timer is not None:
                timer.cancel()

    async def close(self) -> None:
        for conn in list(self._all):
            if conn.transport is not None:
                conn.transport.close()
        self._all.clear()
        self._idle.clear()
        await asyncio.sleep(0)

    async def __aenter__(self) -> Pool:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
