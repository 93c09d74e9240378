"""When a request ends: stop strings, max_tokens, end-of-sequence with min_tokens and ignore_eos, and
prompts longer than the context."""

import pytest
import torch
from engine_server import one_torch_thread, post_json, request, sse_events, start_engine

from rooftop.engine.model.config import EOS_ID, ModelConfig
from rooftop.engine.model.reference import reference_logits
from rooftop.engine.model.weights import random_model, save_model

CONTEXT = 128


@pytest.fixture(scope="module")
def server():
    s = start_engine("--context-length", str(CONTEXT), "--page-size", "16", "--kv-cache-tokens", "512")
    yield s.url
    s.stop()


@pytest.fixture(scope="module")
def eos_server(tmp_path_factory):
    """A model whose greedy choice is always <eos>: every token embeds alike, so the last hidden state is
    the same at every position of every prompt, and <eos>'s output row is twice the best row."""
    with one_torch_thread(), torch.no_grad():
        model = random_model(ModelConfig.preset("tiny"), seed=0, dtype=torch.float32)
        model.embedding.weight[:] = model.embedding.weight[65].clone()
        logits = reference_logits(model, [256, 1, 2])[-1]
        best = int(logits.argmax())
        assert logits[best] > 0
        model.lm_head.weight[EOS_ID] = 2 * model.lm_head.weight[best]
        assert int(reference_logits(model, [256, 7, 9, 200])[-1].argmax()) == EOS_ID
        path = tmp_path_factory.mktemp("eos-model")
        save_model(model, path)
    s = start_engine("--model", str(path), "--context-length", str(CONTEXT), "--page-size", "16",
                     "--kv-cache-tokens", "512")
    yield s.url
    s.stop()


def complete(url: str, **body) -> dict:
    status, reply = post_json(url, "/v1/completions", {"temperature": 0, **body})
    assert status == 200, reply
    return reply


def test_eos_stops_unless_min_tokens_or_ignore_eos(eos_server):
    plain = complete(eos_server, prompt="hello", max_tokens=10, return_token_ids=True)
    assert plain["choices"][0]["token_ids"] == [EOS_ID] and plain["choices"][0]["finish_reason"] == "stop"
    assert plain["choices"][0]["text"] == "" and plain["usage"]["completion_tokens"] == 1
    # min_tokens: <eos> is barred for the first 4 tokens, so it comes 5th
    held = complete(eos_server, prompt="hello", max_tokens=10, min_tokens=4, return_token_ids=True)
    ids = held["choices"][0]["token_ids"]
    assert len(ids) == 5 and EOS_ID not in ids[:4] and ids[4] == EOS_ID
    assert held["choices"][0]["finish_reason"] == "stop" and held["usage"]["completion_tokens"] == 5
    # ignore_eos: it keeps going through <eos> tokens to max_tokens
    ignored = complete(eos_server, prompt="hello", max_tokens=6, ignore_eos=True, return_token_ids=True)
    assert ignored["choices"][0]["token_ids"] == [EOS_ID] * 6 and ignored["choices"][0]["finish_reason"] == "length"
    status, raw = request(eos_server, "/v1/completions", {"prompt": "hi", "max_tokens": 10, "min_tokens": 2,
                                                          "temperature": 0, "stream": True})
    chunks = sse_events(raw)[:-1]
    assert status == 200 and len(chunks) == 3 and chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_max_tokens_ends_with_length(server):
    reply = complete(server, prompt="abc", max_tokens=7, ignore_eos=True)
    assert reply["usage"]["completion_tokens"] == 7 and reply["choices"][0]["finish_reason"] == "length"


def test_stop_string_cuts_the_text_before_it_streamed_or_not(server):
    free = complete(server, prompt="stop here", max_tokens=24, ignore_eos=True)["choices"][0]["text"]
    # two characters from the middle on, without a replacement character (bytes that were not UTF-8)
    starts = [i for i in range(len(free) // 2, len(free) - 1) if "\ufffd" not in free[i:i + 2]]
    assert starts, repr(free)  # the fixed seed's text has such a pair
    stop = free[starts[0]:starts[0] + 2]
    want = free[:free.find(stop)]
    cut = complete(server, prompt="stop here", max_tokens=24, ignore_eos=True, stop=["\x00never", stop])
    assert cut["choices"][0]["text"] == want and cut["choices"][0]["finish_reason"] == "stop"
    assert cut["usage"]["completion_tokens"] < 24
    status, raw = request(server, "/v1/completions", {"prompt": "stop here", "max_tokens": 24, "ignore_eos": True,
                                                      "temperature": 0, "stop": stop, "stream": True})
    chunks = sse_events(raw)[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == want  # nothing of the stop string leaked
    assert len(chunks) == cut["usage"]["completion_tokens"] and chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_prompt_longer_than_context_is_refused_and_server_goes_on(server):
    status, err = post_json(server, "/v1/completions", {"prompt": "z" * (2 * CONTEXT), "max_tokens": 1})
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"
    status, err = post_json(server, "/v1/completions", {"prompt": list(range(1, CONTEXT + 1)), "max_tokens": 1})
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"
    # exactly at the limit is fine: prompt + max_tokens == context
    reply = complete(server, prompt=list(range(1, CONTEXT - 2)), max_tokens=3, ignore_eos=True)
    assert reply["usage"]["total_tokens"] == CONTEXT
