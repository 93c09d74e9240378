"""Must show 2: the official openai client works against the engine, streamed and not."""

import openai
import pytest
from engine_server import start_engine


@pytest.fixture(scope="module")
def client():
    s = start_engine("--context-length", "256", "--page-size", "16", "--kv-cache-tokens", "1024")
    yield openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0, timeout=120)
    s.stop()


def test_models_list_names_the_preset(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_completions_streamed_and_not_agree(client):
    args = dict(model="tiny", prompt="Hello", max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**args)
    assert whole.usage.prompt_tokens == 6 and whole.usage.completion_tokens == 6 and whole.usage.total_tokens == 12
    assert whole.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    token_chunks = [c for c in chunks if c.choices]
    assert len(token_chunks) == 6
    assert "".join(c.choices[0].text for c in token_chunks) == whole.choices[0].text
    assert token_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 6 and not chunks[-1].choices


def test_chat_streamed_and_not_agree(client):
    args = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0,
                extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**args)
    assert whole.choices[0].message.role == "assistant" and whole.usage.completion_tokens == 5
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_seeded_sampling_repeats_and_logprobs_parse(client):
    args = dict(model="tiny", prompt="seed", max_tokens=8, temperature=1.0, top_p=0.9, seed=42, logprobs=3,
                extra_body={"ignore_eos": True})
    a, b = client.completions.create(**args), client.completions.create(**args)
    assert a.choices[0].text == b.choices[0].text
    assert a.choices[0].logprobs.token_logprobs == b.choices[0].logprobs.token_logprobs
    assert all(len(top) == 3 for top in a.choices[0].logprobs.top_logprobs)
    others = {client.completions.create(**{**args, "seed": s}).choices[0].logprobs.token_logprobs[0]
              for s in range(43, 47)}
    assert len(others | {a.choices[0].logprobs.token_logprobs[0]}) > 1  # seeds matter


def test_errors_are_the_clients_exceptions(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="tiny", prompt="x" * 300, max_tokens=4)
    assert "maximum context length is 256" in str(exc.value)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="not-served", prompt="x", max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=0)


def test_explicit_nones_and_a_listed_prompt_are_taken(client):
    """The client sends what it is given, None as null (refused as a wrong type before)."""
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                          temperature=0, n=None, logprobs=None, top_logprobs=None,
                                          stream_options=None, presence_penalty=None)
    assert chat.usage.completion_tokens == 3 and chat.choices[0].logprobs is None
    args = dict(model="tiny", max_tokens=3, temperature=0, n=None, logprobs=None, echo=None, best_of=None)
    listed = client.completions.create(prompt=["Hello"], **args)
    assert listed.choices[0].text == client.completions.create(prompt="Hello", **args).choices[0].text
    with pytest.raises(openai.BadRequestError, match="a batch of prompts is not supported"):
        client.completions.create(prompt=["Hello", "there"], **args)
