"""The request fields of the engine's API as vLLM reads them: top_k, stop_token_ids, echo, nulls as defaults,
a prompt in a list, logprobs' text offsets; sampling fields it does not implement are refused, not ignored."""

import json

import pytest
from engine_server import post_json, request, sse_events, start_engine

CONTEXT = 128


@pytest.fixture(scope="module")
def server():
    s = start_engine("--context-length", str(CONTEXT), "--page-size", "16", "--kv-cache-tokens", "1024")
    yield s.url
    s.stop()


def complete(url: str, **body) -> dict:
    status, reply = post_json(url, "/v1/completions", {"temperature": 0, "ignore_eos": True, **body})
    assert status == 200, reply
    return reply["choices"][0]


def streamed(url: str, **body) -> list[dict]:
    status, raw = request(url, "/v1/completions", {"temperature": 0, "ignore_eos": True, **body, "stream": True})
    assert status == 200, raw
    return [e["choices"][0] for e in sse_events(raw)[:-1]]


def test_top_k_one_samples_the_greedy_tokens(server):
    greedy = complete(server, prompt="top k", max_tokens=20, return_token_ids=True)["token_ids"]
    sampled = complete(server, prompt="top k", max_tokens=20, return_token_ids=True, temperature=1.0, seed=5)
    assert sampled["token_ids"] != greedy  # the seed draws other tokens at temperature 1 ...
    one = complete(server, prompt="top k", max_tokens=20, return_token_ids=True, temperature=1.0, seed=5, top_k=1)
    assert one["token_ids"] == greedy  # ... but not from one token (top_k was ignored before)
    minus_one = complete(server, prompt="top k", max_tokens=20, return_token_ids=True, temperature=1.0, seed=5,
                         top_k=-1)
    assert minus_one["token_ids"] == sampled["token_ids"]  # -1 (and 0) is every token


def test_stop_token_ids_end_the_request_with_stop_and_without_the_token_text(server):
    free = complete(server, prompt="stop ids", max_tokens=24, return_token_ids=True)
    ids = free["token_ids"]
    # the first token that is a printable ASCII byte and first seen at position 5 or later
    at = next(i for i in range(5, len(ids)) if 32 < ids[i] < 127 and ids[i] not in ids[:i])
    stop_id = ids[at]
    cut = complete(server, prompt="stop ids", max_tokens=24, return_token_ids=True, stop_token_ids=[stop_id])
    assert cut["finish_reason"] == "stop" and cut["token_ids"] == ids[:at + 1]
    assert cut["text"] == free["text"][:free["text"].index(chr(stop_id))]  # the stop token's text is not in it
    chunks = streamed(server, prompt="stop ids", max_tokens=24, stop_token_ids=[stop_id])
    assert len(chunks) == at + 1 and chunks[-1]["finish_reason"] == "stop"
    assert "".join(c["text"] for c in chunks) == cut["text"]
    # min_tokens bars it: the request goes past it
    held = complete(server, prompt="stop ids", max_tokens=24, return_token_ids=True, stop_token_ids=[stop_id],
                    min_tokens=at + 2)
    assert stop_id not in held["token_ids"][:at + 2] and len(held["token_ids"]) >= at + 2
    status, err = post_json(server, "/v1/completions", {"prompt": "a", "stop_token_ids": [10**6]})
    assert status == 400 and err["error"]["param"] == "stop_token_ids"


def test_echo_puts_the_prompt_before_the_completion(server):
    plain = complete(server, prompt="echo me", max_tokens=4)
    echoed = complete(server, prompt="echo me", max_tokens=4, echo=True)
    assert echoed["text"] == "echo me" + plain["text"]
    chunks = streamed(server, prompt="echo me", max_tokens=4, echo=True)
    assert chunks[0]["text"].startswith("echo me") and "".join(c["text"] for c in chunks) == echoed["text"]
    # token ids: their text (the <bos> has none)
    assert complete(server, prompt=[256, 104, 105], max_tokens=2, echo=True)["text"].startswith("hi")
    status, err = post_json(server, "/v1/completions", {"prompt": "a", "echo": True, "logprobs": 1})
    assert status == 400 and err["error"]["param"] == "echo" and "logprobs" in err["error"]["message"]


def test_null_is_the_default(server):
    body = {"prompt": "nulls", "max_tokens": 3, "temperature": 0, "n": None, "stream": None, "logprobs": None,
            "stream_options": None, "stop": None, "seed": None, "top_k": None, "best_of": None, "min_p": None}
    status, reply = post_json(server, "/v1/completions", body)
    assert status == 200 and reply["choices"][0]["logprobs"] is None and reply["usage"]["completion_tokens"] == 3
    chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "n": None, "logprobs": None,
            "top_logprobs": None, "stream": True, "stream_options": {"include_usage": None}}
    status, raw = request(server, "/v1/chat/completions", chat)
    events = sse_events(raw)
    assert status == 200 and events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])


def test_prompt_in_a_one_element_list(server):
    want = complete(server, prompt="listed", max_tokens=3, return_token_ids=True)
    ids = want["prompt_token_ids"]
    for prompt in (["listed"], [ids]):
        got = complete(server, prompt=prompt, max_tokens=3, return_token_ids=True)
        assert got["prompt_token_ids"] == ids and got["token_ids"] == want["token_ids"]
    for batch in (["a", "b"], [[256, 97], [256, 98]]):
        status, err = post_json(server, "/v1/completions", {"prompt": batch, "max_tokens": 3})
        assert status == 400 and err["error"]["param"] == "prompt"
        assert "a batch of prompts is not supported" in err["error"]["message"]


def test_text_offsets_are_where_each_token_begins_with_or_without_stop(server):
    free = complete(server, prompt="offsets", max_tokens=20, logprobs=1, return_token_ids=True)
    ids, text, offsets = free["token_ids"], free["text"], free["logprobs"]["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] < len(text)
    assert all(text[at] == chr(i) for i, at in zip(ids, offsets, strict=True) if 32 <= i < 127)
    at = next(i for i in range(6, len(ids)) if 32 < ids[i] < 127 and ids[i] not in ids[:i])
    stop = chr(ids[at]) + chr(ids[at + 1]) if at + 1 < len(ids) else chr(ids[at])
    cut = complete(server, prompt="offsets", max_tokens=20, logprobs=1, stop=[stop, "\x00never"])
    n = len(cut["logprobs"]["tokens"])
    assert cut["finish_reason"] == "stop" and n < len(ids)
    # the same tokens at the same offsets (they lagged the text held back for the stop strings before)
    assert cut["logprobs"]["text_offset"] == offsets[:n]
    chunks = streamed(server, prompt="offsets", max_tokens=20, logprobs=1, stop=[stop, "\x00never"])
    assert [c["logprobs"]["text_offset"][0] for c in chunks] == offsets[:n]


@pytest.mark.parametrize("field, value", [
    ("min_p", 0.1), ("repetition_penalty", 1.2), ("presence_penalty", 0.5), ("frequency_penalty", -0.5),
    ("logit_bias", {"65": 5}), ("best_of", 2), ("n", 2), ("include_stop_str_in_output", True),
    ("use_beam_search", True), ("response_format", {"type": "json_object"}), ("skip_special_tokens", False),
])
def test_sampling_fields_it_does_not_implement_are_refused(server, field, value):
    status, err = post_json(server, "/v1/completions", {"prompt": "a", "max_tokens": 2, field: value})
    assert status == 400 and err["error"]["param"] == field and err["error"]["code"] == "unsupported_parameter"
    assert err["error"]["message"].startswith(f"unsupported parameter {field}")


def test_their_defaults_and_other_fields_are_accepted(server):
    body = {"prompt": "a", "max_tokens": 2, "min_p": 0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
            "frequency_penalty": 0, "logit_bias": {}, "best_of": 1, "n": 1, "include_stop_str_in_output": False,
            "response_format": {"type": "text"}, "user": "someone", "metadata": {"x": 1}, "ignore_eos": True}
    status, reply = post_json(server, "/v1/completions", body)
    assert status == 200 and reply["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("path, body, param, words", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs",
     "logprobs"),
    ("/v1/completions", {"prompt": "a", "stream_options": {"include_usage": True}}, "stream_options", "stream"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
     "max_completion_tokens", "max_completion_tokens must be at least 1"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 500},
     "max_completion_tokens", "maximum context length"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 2.5}, "max_tokens", "integer"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "echo": True}, "echo", "unsupported"),
])
def test_clear_refusals_name_the_field_sent(server, path, body, param, words):
    status, err = post_json(server, path, body)
    assert status == 400 and err["error"]["param"] == param and words in err["error"]["message"], err


def test_whole_floats_count(server):
    reply = complete(server, prompt="floats", max_tokens=3.0, min_tokens=1.0, logprobs=2.0, seed=7.0)
    assert len(reply["logprobs"]["tokens"]) == 3 and len(reply["logprobs"]["top_logprobs"][0]) == 2
    # Greedy and past <eos>, as `complete` asks: sampled unseeded, a random model may end after one token.
    status, reply = post_json(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                               "max_completion_tokens": 2.0, "logprobs": True,
                                                               "top_logprobs": 1.0, "temperature": 0,
                                                               "ignore_eos": True})
    assert status == 200 and reply["usage"]["completion_tokens"] == 2


def test_bad_json_unknown_routes_and_methods_are_openai_errors(server):
    status, raw = request(server, "/v1/completions", b"{not json")
    assert status == 400 and json.loads(raw)["error"]["code"] == "invalid_json"
    status, raw = request(server, "/v1/nothing", {"prompt": "a"})
    err = json.loads(raw)["error"]
    assert status == 404 and err["type"] == "not_found_error" and "/v1/nothing" in err["message"]
    status, raw = request(server, "/v1/completions", method="GET")
    err = json.loads(raw)["error"]
    assert status == 405 and set(err) == {"message", "type", "param", "code"} and "GET" in err["message"]
