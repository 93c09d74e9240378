"""Speculative decoding in the running engine (tiny preset, float32 on CPU): greedy outputs with n-gram and
MTP drafts are the plain engine's token for token; the steps' counts add up; rejected drafts leave nothing
behind (pages, prefix cache, the MTP module's rows); seeded sampling with drafts runs, ends and repeats."""

import contextlib
import queue

import pytest
import torch

from rooftop.engine.engine import Engine, StepRecord, TokenEvent
from rooftop.engine.kv.block_manager import page_hash
from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.batch import build_batch
from rooftop.engine.model.config import EOS_ID, PRESETS
from rooftop.engine.model.weights import random_model
from rooftop.engine.sequence import SamplingParams
from rooftop.engine.spec.config import SpecConfig
from rooftop.engine.spec.loop import SpeculativeEngine

PAGE = 16
CONFIG = PRESETS["tiny"]
MODEL = random_model(CONFIG, seed=0)
SPECS = {"ngram": SpecConfig("ngram", 3, 1, 3), "mtp": SpecConfig("mtp", 2)}
BOS = 256


def text(s: str) -> list[int]:
    return [BOS, *s.encode()]


def tokens(n: int, salt: int) -> list[int]:
    return [BOS] + [(31 * i + 7 * salt) % 94 + 32 for i in range(n - 1)]


# 32 prompts of up to 40 tokens (with 16 more made, below the indexer's 64 picks): half repeat themselves,
# so n-gram lookup finds what to draft, half do not
REPEATING = [text(s) for s in (
    "abcabcabcabcabcabcabc", "the cat sat. the cat sat. the cat", "1 2 3 1 2 3 1 2 3 1 2 3 1", "xyxyxyxyxyxyxyxy",
    "to be or not to be, to be or not to be", "la la la la la la la la", "ab ab ab ab ab ab ab ab ab",
    "go go go go go go", "0101010101010101010101", "roof top roof top roof top", "aaaaaaaaaaaaaaaaaaaaaa",
    "one two one two one two one two", "[[[]]] [[[]]] [[[]]]", "zq zq zq zq zq zq zq", "hello hello hello hello",
    "12341234123412341234")]
OTHERS = [tokens(10 + 2 * i, i) for i in range(16)]
PROMPTS = REPEATING + OTHERS
MAX_TOKENS = 16


def greedy(n: int, logprobs: int | None = None) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=logprobs)


def make_engine(kind: str, num_blocks: int = 256, context_length: int = 128) -> tuple[Engine, list[StepRecord]]:
    """kind: "plain" (no speculation, no prefix cache: every token computed afresh) or a SPECS key."""
    cache = KVCache(CONFIG, num_blocks, PAGE, torch.float32, "cpu", num_layers=CONFIG.num_hidden_layers + 1)
    common = dict(context_length=context_length, chunked_prefill_size=256, cuda_graphs=False)
    if kind == "plain":
        engine = Engine(MODEL, cache, enable_prefix_caching=False, **common)
    else:
        engine = SpeculativeEngine(MODEL, cache, speculative=SPECS[kind], **common)
    records: list[StepRecord] = []
    engine.step_listeners.append(records.append)
    return engine, records


def serve(engine: Engine, wave: list[tuple[list[int], SamplingParams]], stops: list[str] | None = None,
          ) -> list[list[TokenEvent]]:
    """A wave's requests submitted together (before the loop takes any), each one's events once all ended."""
    sinks = [queue.Queue() for _ in wave]
    for (prompt, params), sink in zip(wave, sinks, strict=True):
        engine.submit(prompt, params, stops or [], sink.put)
    out = []
    for sink in sinks:
        events = [sink.get(timeout=120)]
        while events[-1].finish_reason is None:
            events.append(sink.get(timeout=120))
        assert all(e.error is None for e in events), events[-1].error
        out.append(events)
    return out


@contextlib.contextmanager
def running(engine: Engine):
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()


def ids(events: list[TokenEvent]) -> list[int]:
    return [e.token_id for e in events]


@pytest.fixture(scope="module")
def runs() -> dict:
    """Per engine kind: the 32 prompts' events, then a follow-up wave whose prompts are four of them with
    their outputs (pages that decode steps filled, beside rejected drafts) and new text; records; engine."""
    out = {}
    first_wave = [(p, greedy(MAX_TOKENS, logprobs=2 if i % 4 == 0 else None)) for i, p in enumerate(PROMPTS)]
    for kind in ("plain", "ngram", "mtp"):
        engine, records = make_engine(kind)
        with running(engine):
            first = serve(engine, first_wave)
            follow = [(PROMPTS[i] + ids(first[i]) + text(" more")[1:], greedy(8)) for i in (0, 1, 4, 20)]
            second = serve(engine, follow)
        out[kind] = {"first": first, "second": second, "records": records, "engine": engine}
    return out


@pytest.mark.parametrize("kind", ["ngram", "mtp"])
def test_greedy_outputs_are_the_plain_engines_token_for_token(runs, kind):
    plain, spec = runs["plain"], runs[kind]
    for a, b in zip(plain["first"] + plain["second"], spec["first"] + spec["second"], strict=True):
        assert ids(a) == ids(b)
        for x, y in zip(a, b, strict=True):  # logprobs too, as the plain sampler gives them
            assert abs(x.logprob - y.logprob) < 1e-4
            assert [t for t, _ in x.top] == [t for t, _ in y.top]
    assert all(len(events) == MAX_TOKENS and events[-1].finish_reason == "length" for events in spec["first"])
    records = spec["records"]
    drafted = sum(r.num_draft_tokens for r in records)
    accepted = sum(r.num_accepted_tokens for r in records)
    assert drafted > 0
    if kind == "ngram":  # the repeating prompts' outputs repeat too: lookup drafts what the model then says
        assert accepted > 0
    print(f"{kind}: {accepted} of {drafted} draft tokens accepted")  # MTP's random weights: near chance


@pytest.mark.parametrize("kind", ["ngram", "mtp"])
def test_the_steps_account_for_every_token(runs, kind):
    spec = runs[kind]
    records = spec["records"]
    made = sum(len(events) for events in spec["first"] + spec["second"])
    prompts = len(spec["first"]) + len(spec["second"])
    # each prompt's last chunk makes its first token; a decoding sequence makes its accepted drafts and one more
    decoding = sum(r.num_decode_tokens - r.num_draft_tokens for r in records)
    assert made == prompts + decoding + sum(r.num_accepted_tokens for r in records)
    for r in records:
        per_pos = r.num_accepted_tokens_per_pos
        assert per_pos is not None and len(per_pos) == SPECS[kind].num_speculative_tokens
        assert sum(per_pos) == r.num_accepted_tokens <= r.num_draft_tokens
        # a draft is kept only after the ones before it
        assert all(a >= b for a, b in zip(per_pos, per_pos[1:], strict=False))
        assert r.num_drafts <= r.num_draft_tokens <= r.num_drafts * SPECS[kind].num_speculative_tokens
        assert r.num_tokens >= r.num_decode_tokens >= r.num_draft_tokens  # computed tokens include the drafts
    assert sum(r.num_tokens - r.num_decode_tokens for r in records) == sum(
        len(p) for p in PROMPTS) + sum(len(PROMPTS[i]) + MAX_TOKENS + 5 for i in (0, 1, 4, 20)) - sum(
        r.num_prefix_hit_tokens for r in records)


def test_rejected_drafts_leave_no_page_behind_and_the_prefix_cache_holds_only_kept_tokens(runs):
    for kind in ("ngram", "mtp"):
        spec = runs[kind]
        bm = spec["engine"].block_manager
        assert bm.num_free_blocks == bm.num_blocks and not any(bm.ref_counts)
        # every registered page hashes a run of tokens some request really has (prompt and kept tokens)
        real = set()
        sequences = [p + ids(e) for p, e in zip(PROMPTS, spec["first"], strict=True)]
        sequences += [PROMPTS[i] + ids(spec["first"][i]) + text(" more")[1:] + ids(e)
                      for i, e in zip((0, 1, 4, 20), spec["second"], strict=True)]
        for seq in sequences:
            parent = b""
            for start in range(0, len(seq) - PAGE + 1, PAGE):
                parent = page_hash(parent, seq[start:start + PAGE])
                real.add(parent)
        assert bm.hash_to_block and set(bm.hash_to_block) <= real
        # the follow-ups found the pages of their first turn, decode steps' pages among them
        hits = sum(r.num_prefix_hit_tokens for r in spec["records"])
        assert hits >= sum((len(PROMPTS[i]) + MAX_TOKENS - 1) // PAGE * PAGE for i in (0, 1, 4, 20))


def test_the_mtp_modules_rows_after_rollbacks_are_a_fresh_computations(runs):
    spec = runs["mtp"]
    drafter = spec["engine"].speculator.mtp
    sequences = [PROMPTS[i] + ids(spec["first"][i]) + text(" more")[1:] + ids(e)
                 for i, e in zip((0, 1, 4, 20), spec["second"], strict=True)]
    seq_ids = [e[0].seq_id for e in spec["second"]]
    checked = 0
    for seq_id, seq in zip(seq_ids, sequences, strict=True):
        held = drafter.held(seq_id)  # those that ended in the last step are still held
        if held is None:
            continue
        num_cached, first, state = held
        assert num_cached == len(seq) - 1
        # the model over the whole sequence in one prefill, then the MTP module over it, in a fresh cache
        cache = KVCache(CONFIG, 8, PAGE, torch.float32, "cpu", num_layers=CONFIG.num_hidden_layers + 1)
        table = list(range(-(-len(seq) // PAGE)))
        batch = build_batch([seq[:num_cached]], [0], [table], PAGE, 128)
        batch.logit_rows, batch.return_hidden = torch.arange(num_cached), True
        _, hidden = MODEL(batch, cache)
        mtp_batch = build_batch([seq[1:num_cached + 1]], [0], [table], PAGE, 128)
        mtp_batch.return_hidden = True
        logits, states = MODEL.mtp_forward(mtp_batch, cache, hidden)
        assert torch.allclose(state, states[-1], atol=1e-4, rtol=1e-4)
        assert first == logits[-1].argmax().item()
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("kind", ["ngram", "mtp"])
def test_seeded_sampling_with_drafts_ends_properly_and_repeats(kind):
    wave = [(p, SamplingParams(max_tokens=12, temperature=0.8, top_p=0.95, top_k=40, seed=s, min_tokens=4))
            for s, p in enumerate(REPEATING[:6] + OTHERS[:2])]
    engine, records = make_engine(kind)
    with running(engine):
        first = serve(engine, wave, stops=["zz"])
        again = serve(engine, wave, stops=["zz"])  # the same seeds: the same tokens (prompts now cached)
    assert [ids(e) for e in first] == [ids(e) for e in again]
    for events in first:
        assert events[-1].finish_reason in ("stop", "length")
        assert 4 <= len(events) <= 12 and EOS_ID not in ids(events)[:4]
        assert [e.num_completion_tokens for e in events] == list(range(1, len(events) + 1))
        assert "zz" not in "".join(e.text for e in events)
    assert sum(r.num_draft_tokens for r in records) > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_preempted_requests_under_speculation_serve_the_plain_tokens():
    # 12 pages of 16 tokens; four prompts grow to ~100 tokens each: the newest give their pages back
    wave = [(REPEATING[i] + tokens(8, i)[1:], greedy(60)) for i in range(4)]
    served = {}
    for kind in ("plain", "ngram"):
        engine, records = make_engine(kind, num_blocks=12)
        with running(engine):
            served[kind] = [ids(e) for e in serve(engine, wave)]
        assert sum(r.num_preemptions for r in records) > 0
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert served["plain"] == served["ngram"]
