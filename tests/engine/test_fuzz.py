"""Must show 5: the API fuzzed with hypothesis (bounded): never a 5xx, and the server stays up."""

import json

import pytest
from engine_server import request, sse_events, start_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CASES = 150

json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
small_int = st.integers(-3, 6)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]) | json_value},
                                optional={"content": st.text(max_size=30) | json_value
                                          | st.lists(st.fixed_dictionaries({"type": st.just("text"),
                                                                            "text": st.text(max_size=10)}),
                                                     max_size=2)})
sampling = {
    "model": st.sampled_from(["tiny", "other"]) | json_value,
    "temperature": st.floats(-1, 3) | st.sampled_from([1e-300, 1e-5, 2e-5, 100.0]) | json_value,
    "top_p": st.floats(-0.5, 1.5) | st.sampled_from([1e-300, 5e-324, 1e-5]) | json_value,
    "seed": st.integers(-(2**70), 2**70) | json_value,
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3) | json_value,
    "ignore_eos": st.booleans() | json_value,
    "min_tokens": small_int | json_value,
    "stream": st.booleans() | json_value,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | json_value}) | json_value,
    "n": st.integers(0, 3) | json_value,
    "return_token_ids": st.booleans(),
}
# max_tokens is always there (mostly small): without it chat would run to the end of the context
completion = st.fixed_dictionaries(
    {"max_tokens": small_int | st.just(10**30) | json_value},
    optional={"prompt": st.text(max_size=40) | st.lists(st.integers(-5, 400), max_size=8) | json_value,
              "logprobs": st.integers(-2, 25) | json_value, "echo": st.booleans(), **sampling},
)
chat = st.fixed_dictionaries(
    {"max_tokens": small_int | json_value},
    optional={"messages": st.lists(message, max_size=3) | json_value, "logprobs": st.booleans() | json_value,
              "top_logprobs": st.integers(-2, 25) | json_value, "max_completion_tokens": small_int, **sampling},
)
tokenize = st.fixed_dictionaries({}, optional={"prompt": st.text(max_size=30) | json_value,
                                               "messages": st.lists(message, max_size=2) | json_value,
                                               "add_special_tokens": st.booleans() | json_value})
detokenize = st.fixed_dictionaries({}, optional={"tokens": st.lists(st.integers(-10, 1000), max_size=8) | json_value})

case = st.one_of(
    st.tuples(st.just("/v1/completions"), completion),
    st.tuples(st.just("/v1/chat/completions"), chat),
    st.tuples(st.just("/tokenize"), tokenize),
    st.tuples(st.just("/detokenize"), detokenize),
    st.tuples(st.sampled_from(["/v1/completions", "/v1/chat/completions", "/tokenize", "/start_profile"]),
              st.binary(max_size=40)),
)


@pytest.fixture(scope="module")
def server():
    s = start_engine("--context-length", "64", "--page-size", "16", "--kv-cache-tokens", "512")
    yield s.url
    s.stop()


def test_fuzzed_requests_never_get_a_5xx(server):
    seen: dict[int, int] = {}

    @settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case)
    def one(endpoint_body):
        endpoint, body = endpoint_body
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        status, reply = request(server, endpoint, raw)
        seen[status] = seen.get(status, 0) + 1
        assert status < 500, (endpoint, raw, reply[:300])
        if status == 200 and isinstance(body, dict) and body.get("stream") is True and endpoint.startswith("/v1"):
            assert sse_events(reply)[-1] == "[DONE]"
        elif status != 200:
            assert "error" in json.loads(reply) or "detail" in json.loads(reply)

    one()
    assert request(server, "/health")[0] == 200
    status, _ = request(server, "/v1/completions", {"prompt": "still up", "max_tokens": 2})
    assert status == 200
    assert seen.get(200, 0) > 10 and sum(v for k, v in seen.items() if 400 <= k < 500) > 10, seen
