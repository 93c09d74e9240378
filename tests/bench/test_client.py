"""How one response becomes a record: SSE events, usage, error events, HTTP errors."""

from rooftop.bench.client import _Sink
from rooftop.bench.records import RequestRecord


def feed(events: list[bytes], status: int = 200, stream: bool = True) -> RequestRecord:
    rec = RequestRecord(index=0, concurrency=1, request_rate=None, repeat=0, warmup=False, decided_ns=0)
    sink = _Sink(rec, chat=False, stream=stream)
    sink.on_head(status, {}, 1)
    for i, e in enumerate(events):
        sink.on_body(e, 10 + i)
    sink.on_end(100)
    sink.finish()
    return rec


def test_tokens_usage_and_stamps():
    rec = feed([b'data: {"choices":[{"text":"a"}]}\n\n', b'data: {"choices":[{"text":"b","finish_reason":"length"}]}\n\n',
                b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\ndata: [DONE]\n\n'])
    assert rec.ok and rec.output_text == "ab" and rec.chunk_ns == [10, 11]
    assert (rec.prompt_tokens_server, rec.completion_tokens_server, rec.finish_reason) == (5, 2, "length")


def test_an_error_event_in_the_stream_fails_the_request_with_its_message():
    rec = feed([b'data: {"choices":[{"text":"a"}]}\n\n',
                b'data: {"error":{"message":"decode worker 127.0.0.1:9 went away","type":"pd_transfer"}}\n\n',
                b"data: [DONE]\n\n"])
    assert not rec.ok and rec.error_class == "stream_error"
    assert "decode worker 127.0.0.1:9 went away" in rec.error


def test_a_stream_cut_short_is_incomplete_and_http_errors_keep_their_body():
    assert feed([b'data: {"choices":[{"text":"a"}]}\n\n']).error_class == "incomplete"
    rec = feed([b'{"error":{"message":"max_tokens must be positive"}}'], status=400)
    assert rec.error_class == "http_4xx" and "max_tokens must be positive" in rec.error
