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


def test_a_reasoning_models_thinking_times_the_stream_but_is_not_the_answer():
    """Servers with a reasoning parser stream the thinking as delta.reasoning_content (or reasoning): its
    tokens are generated like any other, so the first of them is the first token (TTFT) and each is a gap."""
    rec = RequestRecord(index=0, concurrency=1, request_rate=None, repeat=0, warmup=False, decided_ns=0)
    sink = _Sink(rec, chat=True, stream=True)
    sink.on_head(200, {}, 1)
    deltas = [b'{"reasoning_content":"Let"}', b'{"reasoning_content":" me"}', b'{"reasoning":" think"}',
              b'{"content":"4"}', b'{"content":"."}']
    for i, d in enumerate(deltas):
        sink.on_body(b'data: {"choices":[{"delta":' + d + b'}]}\n\n', 100 + 10 * i)
    sink.on_body(b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n', 150)
    sink.on_end(150)
    sink.finish()
    assert rec.ok and rec.output_text == "4." and rec.chunk_ns == [100, 110, 120, 130, 140]


def test_a_chunk_carries_the_tokens_the_servers_usage_grew_by():
    """Speculative decoding hands out a verified draft's tokens in one chunk. With usage in every chunk
    (continuous_usage_stats, as vLLM sends it) each chunk counts the tokens its usage grew by; vLLM's opening
    chat chunk (a role, no token) is not a token-carrying chunk, and text that comes with no new token is
    the answer's but times nothing."""
    rec = RequestRecord(index=0, concurrency=1, request_rate=None, repeat=0, warmup=False, decided_ns=0)
    sink = _Sink(rec, chat=True, stream=True)
    sink.on_head(200, {}, 1)
    chunks = [(b'{"role":"assistant","content":""}', 0), (b'{"content":"4"}', 1), (b'{"content":"U4U"}', 4),
              (b'{"content":"4U4U"}', 8), (b'{"content":"!"}', 8), (b'{"content":"4"}', 9)]
    for i, (delta, used) in enumerate(chunks):
        sink.on_body(b'data: {"choices":[{"delta":' + delta + b'}],"usage":{"prompt_tokens":7,"completion_tokens":'
                     + str(used).encode() + b'}}\n\n', 100 + 10 * i)
    sink.on_body(b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":9}}\n\ndata: [DONE]\n\n', 170)
    sink.on_end(171)
    sink.finish()
    assert rec.ok and rec.output_text == "4U4U4U4U!4"
    assert rec.chunk_ns == [110, 120, 130, 150] and rec.chunk_tokens == [1, 3, 4, 1]
    assert rec.first_content_ns == 110 and rec.output_tokens == 9 == sum(rec.chunk_tokens)


def test_token_ids_count_a_chunk_and_without_any_count_a_chunk_is_one_token():
    ids = feed([b'data: {"choices":[{"text":"a","token_ids":[97]}]}\n\n',
                b'data: {"choices":[{"text":"bcd","token_ids":[98,99,100],"finish_reason":"length"}]}\n\n',
                b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4}}\n\ndata: [DONE]\n\n'])
    assert ids.chunk_tokens == [1, 3] and ids.output_tokens == 4
    # a server that counts nothing a chunk: each chunk is one token, and the usage still gives the total
    bare = feed([b'data: {"choices":[{"text":"a"}]}\n\n', b'data: {"choices":[{"text":"bcd","finish_reason":"length"}]}\n\n',
                 b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4}}\n\ndata: [DONE]\n\n'])
    assert bare.chunk_tokens == [1, 1] and bare.output_tokens == 4
