"""The load client's HTTP/1.1 response parser, fed the way sockets deliver bytes."""

import asyncio

import pytest

from rooftop.bench import stamped
from rooftop.bench.http import HTTPError, ResponseParser, _Conn, _ParseQueue


def parse(data: bytes, splits: list[int]):
    events = []
    p = ResponseParser(
        lambda s, h, t: events.append(("head", s, h.get("content-type"), t)),
        lambda b, t: events.append(("body", b, t)),
        lambda t: events.append(("end", t)),
    )
    cuts = [0, *splits, len(data)]
    for i, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
        p.feed(data[a:b], now_ns=i)
    return p, events


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"f\r\ndata: {\"a\":1}\n\n\r\n"
    b"f\r\ndata: {\"a\":2}\n\n\r\n"
    b"0\r\n\r\n"
)


def test_chunked_body_whole_and_split_give_the_same_bytes():
    _, whole = parse(CHUNKED, [])
    body = b"".join(e[1] for e in whole if e[0] == "body")
    assert body == b'data: {"a":1}\n\ndata: {"a":2}\n\n'
    assert whole[0][:3] == ("head", 200, "text/event-stream") and whole[-1][0] == "end"
    for cut in range(1, len(CHUNKED)):
        p, ev = parse(CHUNKED, [cut])
        assert b"".join(e[1] for e in ev if e[0] == "body") == body, cut
        assert p.done and ev[-1][0] == "end"


def test_bytes_are_stamped_with_the_feed_that_brought_them():
    head_end = CHUNKED.index(b"\r\n\r\n") + 4
    second = CHUNKED.index(b"f\r\ndata: {\"a\":2}")
    _, ev = parse(CHUNKED, [head_end, second])
    stamps = {e[1]: e[2] for e in ev if e[0] == "body"}
    assert stamps[b'data: {"a":1}\n\n'] == 1 and stamps[b'data: {"a":2}\n\n'] == 2


def test_content_length_and_keep_alive():
    data = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
    p, ev = parse(data, [10, 30])
    assert ev[0][1] == 400 and b"".join(e[1] for e in ev if e[0] == "body") == b"hello"
    assert p.done and not p.keep_alive


def test_garbage_is_an_http_error():
    with pytest.raises(HTTPError):
        parse(b"SSH-2.0-OpenSSH\r\n\r\n", [])
    with pytest.raises(HTTPError):  # a chunk size that does not match its data
        parse(CHUNKED.replace(b"f\r\n", b"e\r\n", 1), [])


def test_every_ready_socket_is_read_before_any_is_parsed():
    """Reads in one loop turn only queue their bytes with their stamps; the parsing comes after all of
    them, each chunk still carrying the stamp of the read that brought it."""
    second = CHUNKED.index(b"f\r\ndata: {\"a\":2}")

    async def turn():
        queue = _ParseQueue()
        events: list[tuple] = []
        conns = []
        for name in ("a", "b"):
            conn = _Conn(queue)
            conn.parser = ResponseParser(lambda s, h, t: None, lambda b, t, n=name: events.append((n, b, t)),
                                         lambda t: None)
            conns.append(conn)
        for conn, base in zip(conns, (100, 200), strict=True):
            conn.data_received_at(CHUNKED[:second], base)
            conn.data_received_at(CHUNKED[second:], base + 1)
        assert events == [] and len(queue.conns) == 2  # read, queued once per connection, not parsed
        await asyncio.sleep(0)
        return events

    events = asyncio.run(turn())
    assert events == [("a", b'data: {"a":1}\n\n', 100), ("a", b'data: {"a":2}\n\n', 101),
                      ("b", b'data: {"a":1}\n\n', 200), ("b", b'data: {"a":2}\n\n', 201)]


def test_realtime_offset_is_read_again_after_its_max_age(monkeypatch):
    reads = iter(range(1, 10))
    monkeypatch.setattr(stamped, "realtime_offset_ns", lambda: next(reads))
    monkeypatch.setattr(stamped, "_offset", [0, -stamped._OFFSET_MAX_AGE_NS])
    t0 = 5_000_000_000
    assert stamped._current_offset_ns(t0) == 1
    assert stamped._current_offset_ns(t0 + stamped._OFFSET_MAX_AGE_NS - 1) == 1  # still fresh
    assert stamped._current_offset_ns(t0 + stamped._OFFSET_MAX_AGE_NS) == 2
