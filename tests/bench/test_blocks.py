"""Trace prompts built from hash ids: requests sharing an id share exactly that block's tokens, checked with the
tokenizer — the synthetic server's byte tokenizer (as the embedded engine's) and a real byte-level BPE."""

import asyncio
import random
from pathlib import Path

import aiohttp
import pytest

from rooftop.bench.blocks import block_layout, trace_prompts
from rooftop.bench.datasets import pseudo_words
from rooftop.bench.tokenizer import HFTokenizer, ServerTokenizer
from rooftop.bench.traces import parse_trace, read_trace
from rooftop.errors import RooftopError

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


def bpe_tokenizer(tmp_path) -> HFTokenizer:
    """A byte-level BPE with merges (words become one or a few tokens) that puts <s> before every prompt."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=["<s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([pseudo_words(random.Random(0), 20000)], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.save(str(tmp_path / "tokenizer.json"))
    return HFTokenizer(tmp_path)


async def prompts_and_ids(tok, seed=0):
    trace = read_trace(DATA / "mooncake.jsonl", "mooncake")
    prompts = await trace_prompts(tok, trace.requests, seed)
    return trace.requests, prompts, [await tok.encode(p.text, True) for p in prompts]


def check_sharing(reqs, prompts, ids):
    """The sample's blocks: lines 1 and 3 share ids 0, 1; line 4 shares 0 with them; lines 2 and 6 share 3, 4
    (line 2's second block is 188 tokens, the start of line 6's)."""
    assert [len(x) for x in ids] == [r.input_len for r in reqs] == [p.input_len for p in prompts]
    one, two, three, four, _, six = ids
    assert one[:1024] == three[:1024] and one[1024:1100] != three[1024:1100]
    assert one[:512] == four[:512] and one[512:600] != four[512:600]
    assert two == six[:700] and six[700:] != []
    assert one[1:512] != two[1:512]  # different ids differ from their first token (after <s>)
    assert len({p.text for p in prompts}) == 6


def test_shared_hash_ids_share_exact_tokens_byte_tokenizer(fake_server):
    srv = fake_server()

    async def go():
        async with aiohttp.ClientSession() as s:
            return await prompts_and_ids(ServerTokenizer(s, srv.url, "fake"))

    check_sharing(*asyncio.run(go()))


def test_shared_hash_ids_share_exact_tokens_bpe(tmp_path):
    tok = bpe_tokenizer(tmp_path)
    reqs, prompts, ids = asyncio.run(prompts_and_ids(tok))
    assert ids[0][0] == tok._tok.token_to_id("<s>")  # the first block holds the BOS and 511 text tokens
    check_sharing(reqs, prompts, ids)
    # each block's text tokenizes alone to exactly the tokens it has in the prompt: no merge across a boundary
    text_ids = [asyncio.run(tok.encode(p.text, False)) for p in prompts]
    assert all(len(t) == r.input_len - 1 for t, r in zip(text_ids, reqs, strict=True))
    # another seed (the next repeat) gives other blocks: a cache warm from one repeat does not serve the next
    _, _, again = asyncio.run(prompts_and_ids(tok, seed=1000))
    assert again[0][1:512] != ids[0][1:512]


def test_block_layout():
    assert block_layout(1100, 1) == [511, 512, 76]
    assert block_layout(512, 0) == [512] and block_layout(513, 1) == [511, 1]


def test_a_prompt_too_short_for_its_bos_is_refused(tmp_path):
    trace = parse_trace('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n', "mooncake", "x")
    with pytest.raises(RooftopError, match="x, line 1: a prompt of 1 token"):
        asyncio.run(trace_prompts(bpe_tokenizer(tmp_path), trace.requests, 0, "x"))
