"""Seeded datasets sized and checked against the server's tokenizer (the synthetic server's bytes)."""

import asyncio
import json

import aiohttp
import pytest

from rooftop.bench import datasets
from rooftop.bench.tokenizer import ServerTokenizer
from rooftop.errors import RooftopError


def build(url: str, fn, *args):
    async def go():
        async with aiohttp.ClientSession() as s:
            tok = ServerTokenizer(s, url, "fake")
            prompts = await fn(tok, *args)
            counts = [await tok.count(p.text) for p in prompts]
            return prompts, counts
    return asyncio.run(go())


def test_random_prompts_have_exact_lengths_and_repeat_by_seed(fake_server):
    srv = fake_server()
    a, counts = build(srv.url, datasets.random_prompts, 6, 37, 9, 5)
    assert counts == [37] * 6 and all(p.output_len == 9 for p in a)
    assert len({p.text for p in a}) == 6
    b, _ = build(srv.url, datasets.random_prompts, 6, 37, 9, 5)
    c, _ = build(srv.url, datasets.random_prompts, 6, 37, 9, 6)
    assert [p.text for p in a] == [p.text for p in b] and [p.text for p in a] != [p.text for p in c]


def test_prefix_prompts_share_their_prefix(fake_server):
    srv = fake_server()
    prompts, counts = build(srv.url, datasets.prefix_prompts, 4, 20, 50, 8, 1)
    first = prompts[0].text[:20]
    assert all(p.text.startswith(first) for p in prompts) and len({p.text for p in prompts}) == 4
    assert all(49 <= n <= 51 for n in counts) and [p.input_len for p in prompts] == counts


def test_sharegpt_takes_first_turns_and_sizes_outputs_from_replies(fake_server, tmp_path):
    srv = fake_server()
    convs = [{"conversations": [{"from": "human", "value": f"question number {i} please"},
                                {"from": "gpt", "value": "answer " * (i + 1)}]} for i in range(5)]
    convs.append({"conversations": [{"from": "human", "value": "hi"}]})  # one turn: skipped
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs))
    prompts, counts = build(srv.url, datasets.sharegpt_prompts, path, 3, 0, None)
    assert len(prompts) == 3 and all(p.text.startswith("question number") for p in prompts)
    assert all(p.output_len == len(("answer " * (int(p.text.split()[2]) + 1)).encode()) for p in prompts)
    assert [p.input_len for p in prompts] == counts


def test_sharegpt_errors_name_the_file(fake_server, tmp_path):
    srv = fake_server()
    with pytest.raises(RooftopError, match="not found"):
        build(srv.url, datasets.sharegpt_prompts, tmp_path / "missing.json", 3, 0, None)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(RooftopError, match="not valid JSON"):
        build(srv.url, datasets.sharegpt_prompts, tmp_path / "bad.json", 3, 0, None)
