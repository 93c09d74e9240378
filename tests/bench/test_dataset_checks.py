"""Datasets refuse what they cannot use with one clear error: a ShareGPT file in another shape, a
tokenizer that counts no tokens, a prefix that does not fit; and ShareGPT prompts that cannot fit the
server's context are dropped and counted."""

import asyncio
import json
import random

import aiohttp
import pytest

from rooftop.bench import datasets
from rooftop.bench.sweep import BenchConfig, build_prompts, run_bench
from rooftop.bench.tokenizer import ServerTokenizer
from rooftop.errors import RooftopError

GOOD = {"conversations": [{"from": "human", "value": "What is the capital of France?"},
                          {"from": "gpt", "value": "The capital of France is Paris."}]}


def sharegpt(url: str, path, n: int = 4, output_len: int | None = None, **kw):
    async def go():
        async with aiohttp.ClientSession() as s:
            return await datasets.sharegpt_prompts(ServerTokenizer(s, url, "fake"), path, n, 0, output_len, **kw)
    return asyncio.run(go())


@pytest.mark.parametrize("entries,why", [
    ([{"conversations": ["hello there friend", "hi back to you"]}], "a turn is a str"),
    ([{"conversations": "human: hello"}], "its conversation is a str"),
    ([GOOD, {"conversations": [{"from": "human", "value": None}, {"from": "gpt", "value": "ok ok ok"}]}],
     "entry 1: a turn's \"value\" is NoneType"),
    ([GOOD, 7, "x"], "2 of 3 entries"),
])
def test_a_file_in_another_shape_is_one_error_counting_its_bad_entries(fake_server, tmp_path, entries, why):
    srv = fake_server()
    (tmp_path / "d.json").write_text(json.dumps(entries))
    with pytest.raises(RooftopError, match="not conversations") as err:
        sharegpt(srv.url, tmp_path / "d.json")
    assert why in err.value.problem and "conversations" in err.value.fix


def test_jsonl_and_openai_messages_are_read(fake_server, tmp_path):
    srv = fake_server()
    (tmp_path / "d.jsonl").write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n")
    assert {p.text for p in sharegpt(srv.url, tmp_path / "d.jsonl")} == {"What is the capital of France?"}
    msgs = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there you"},
                          {"role": "assistant", "content": "hi, how can I help?"}]}]
    (tmp_path / "m.json").write_text(json.dumps(msgs))
    p = sharegpt(srv.url, tmp_path / "m.json", 1)[0]
    assert (p.text, p.output_len) == ("hello there you", len(b"hi, how can I help?"))


def test_a_fixed_output_length_is_taken_as_asked(fake_server, tmp_path):
    srv = fake_server()
    (tmp_path / "d.json").write_text(json.dumps([GOOD] * 3))
    assert [p.output_len for p in sharegpt(srv.url, tmp_path / "d.json", 3, 1)] == [1, 1, 1]
    short = {"conversations": [GOOD["conversations"][0], {"from": "gpt", "value": "Ok"}]}
    (tmp_path / "s.json").write_text(json.dumps([short]))
    with pytest.raises(RooftopError, match="no usable conversations"):  # a 2-token answer sets no length
        sharegpt(srv.url, tmp_path / "s.json")
    assert sharegpt(srv.url, tmp_path / "s.json", 2, 3)[0].output_len == 3


def test_prompts_over_the_servers_context_are_dropped_and_counted(fake_server, tmp_path):
    srv = fake_server()
    long = {"conversations": [{"from": "human", "value": "x" * 3000}, {"from": "gpt", "value": "y" * 100}]}
    (tmp_path / "d.json").write_text(json.dumps([long, GOOD, long]))
    dropped = {}
    out = sharegpt(srv.url, tmp_path / "d.json", 4, max_model_len=2048, dropped=dropped)
    assert {p.text for p in out} == {GOOD["conversations"][0]["value"]} and dropped["over_context"] == 2


class _Counts:
    """A tokenizer that finds no tokens in any text (a /tokenize that does not read the body sent)."""

    async def count(self, text, special=True):
        return 0

    async def encode(self, text, special=True):
        return []


def test_a_tokenizer_counting_no_tokens_fails_fast_naming_tokenizer():
    with pytest.raises(RooftopError, match="counts 0 tokens") as err:
        asyncio.run(datasets.exact_text(_Counts(), random.Random(0), 16))
    assert "--tokenizer" in err.value.fix


def test_a_server_tokenize_answering_no_tokens_names_tokenizer():
    from aiohttp import web

    async def tokenize(request):  # llama.cpp's shape: it reads "content", so vLLM's body gets no tokens
        return web.json_response({"tokens": []})

    async def go():
        app = web.Application()
        app.router.add_post("/tokenize", tokenize)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession() as s:
                tok = ServerTokenizer(s, f"http://127.0.0.1:{port}", "m")
                assert await tok.encode("") == []  # no text, no tokens: fine
                with pytest.raises(RooftopError, match="answered no tokens for 5 characters") as err:
                    await tok.encode("hello")
                assert "--tokenizer" in err.value.fix
        finally:
            await runner.cleanup()
    asyncio.run(go())


def test_prefix_errors_name_prefix_len(fake_server):
    srv = fake_server()

    async def go(**kw):
        async with aiohttp.ClientSession() as s:
            cfg = BenchConfig(base_url=srv.url, input_len=32, output_len=4, **kw)
            return await build_prompts(cfg, ServerTokenizer(s, srv.url, "fake"), 3, 0)
    with pytest.raises(RooftopError, match="^--prefix-len 0"):
        asyncio.run(go(dataset="prefix", prefix_len=0))
    with pytest.raises(RooftopError, match="^--prefix-len 16 has no effect with --dataset random"):
        asyncio.run(go(dataset="random", prefix_len=16))


def test_the_sweep_drops_sharegpt_prompts_past_the_context_and_says_how_many(fake_server, tmp_path):
    srv = fake_server()
    long = {"conversations": [{"from": "human", "value": "x" * 3000}, {"from": "gpt", "value": "y" * 100}]}
    (tmp_path / "d.json").write_text(json.dumps([long, GOOD]))
    # The synthetic server's context is 1 Mi tokens: nothing is over it, and the summary says the filter ran.
    cfg = BenchConfig(base_url=srv.url, dataset="sharegpt", dataset_path=str(tmp_path / "d.json"), output_len=4,
                      concurrency=[1], num_requests=2, warmup=0, telemetry=False)
    f = asyncio.run(run_bench(cfg)).summary["dataset_filter"]
    assert f == {"max_model_len": 1 << 20, "dropped": {"short_or_long": 0, "over_context": 0}}
