"""Per-request records of a load run: every time is an integer from time.perf_counter_ns()."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

STATUS_OK = "ok"
STATUS_ERROR = "error"

# Error classes a request can end with (the `error_class` field).
ERR_CONNECT = "connection_refused"  # nothing listening, or the connection could not be made
ERR_DISCONNECT = "server_disconnected"  # the server closed the connection mid-request
ERR_TIMEOUT = "timeout"
ERR_HTTP_4XX = "http_4xx"
ERR_HTTP_5XX = "http_5xx"
ERR_BAD_STREAM = "bad_stream"  # a chunk that is not the JSON an OpenAI server sends
ERR_INCOMPLETE = "incomplete"  # the stream ended without a finish_reason or [DONE]
ERR_STREAM = "stream_error"  # the server sent an error event inside the stream
ERR_CANCELLED = "cancelled"  # the run was interrupted while the request was in flight
ERR_CLIENT = "client_error"  # anything else raised on the client side (e.g. out of file descriptors)
ERR_CUT_OFF = "cut_off"  # still in flight at the level's deadline: the bench cut it, not a failure of the server

# Classes that can mean the server is gone. A refused connection stops the run; a dropped one stops it
# only when the server is gone indeed (loadgen.run_share: a probe of its port, or many in a row).
SERVER_GONE = frozenset({ERR_CONNECT, ERR_DISCONNECT})
# Classes that are not failures of the server: a level's figures leave them out of `failed`.
NOT_FAILED = frozenset({ERR_CUT_OFF})


@dataclass(slots=True)
class RequestRecord:
    """One request as the load generator saw it; times are perf_counter_ns integers."""

    index: int  # position in its level's request list
    concurrency: int | None  # closed-loop level (or the cap of an open-loop level)
    request_rate: float | None  # open-loop offered rate in requests/s
    repeat: int
    warmup: bool
    decided_ns: int  # when the generator decided to send it: latency starts here
    scheduled_ns: int | None = None  # open loop: when its schedule (arrivals, a trace) had it due; None: closed
    session: int | None = None  # multi-turn: the session (conversation) it belongs to, from 0
    turn: int | None = None  # multi-turn: its turn in the session, from 1
    expected_input_len: int | None = None
    expected_output_len: int | None = None
    sent_ns: int | None = None  # when the request was handed to the HTTP client (after a slot)
    first_byte_ns: int | None = None  # response headers arrived
    chunk_ns: list[int] = field(default_factory=list)  # arrival of each chunk that carried tokens
    # tokens in each such chunk: the server's count (usage growth, token_ids) where it gives one, else 1
    chunk_tokens: list[int] = field(default_factory=list)
    streamed: bool = True  # False: the answer came whole (--no-stream): no per-token times, so no TPOT or ITL
    # A reasoning model's thinking (chat deltas in reasoning_content), counted apart from its answer (content)
    reasoning_tokens: int = 0  # tokens of the chunks that carried reasoning
    first_content_ns: int | None = None  # the first chunk that carried answer text: time to first output token
    end_ns: int | None = None
    status: str = STATUS_ERROR
    error_class: str | None = None
    error: str | None = None
    http_status: int | None = None
    finish_reason: str | None = None
    prompt_tokens_server: int | None = None
    completion_tokens_server: int | None = None
    prompt_tokens_client: int | None = None
    completion_tokens_client: int | None = None
    output_text: str = ""
    # Stamps a calibration server adds to each chunk (same clock, same host).
    server_received_ns: int | None = None
    server_sent_ns: list[int] = field(default_factory=list)
    # Joined with the server's request spans (--otlp-receiver; bench/latency.py): its id in the X-Request-Id
    # header, its TTFT in parts (ms) and what the engine did in each of its ITL outliers
    request_id: str | None = None
    ttft_breakdown: dict | None = None
    itl_outliers: list[dict] | None = None

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    @property
    def output_tokens(self) -> int:
        """Output tokens: the server's usage when given, else the client's count, else chunks."""
        if self.completion_tokens_server is not None:
            return self.completion_tokens_server
        if self.completion_tokens_client is not None:
            return self.completion_tokens_client
        return sum(self.chunk_tokens)

    @property
    def input_tokens(self) -> int:
        """Input tokens: the server's usage when given, else the client's count."""
        if self.prompt_tokens_server is not None:
            return self.prompt_tokens_server
        return self.prompt_tokens_client or self.expected_input_len or 0

    def to_json_dict(self, with_text: bool = False) -> dict:
        d = asdict(self)
        if not with_text:
            d.pop("output_text")
        if not self.server_sent_ns:
            d.pop("server_sent_ns")
            d.pop("server_received_ns")
        if self.ttft_breakdown is None:
            d.pop("ttft_breakdown")
            d.pop("itl_outliers")
        return d
