"""The prefix cache in the running engine (tiny preset, float32 on CPU): a hit skips exactly the cached
tokens, and what the engine serves is what it serves with the cache off, token for token, greedy or
seeded, with requests sharing pages and being preempted."""

import contextlib
import queue

import torch

from rooftop.engine.engine import Engine, StepRecord
from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.config import PRESETS
from rooftop.engine.model.weights import random_model
from rooftop.engine.sequence import SamplingParams

PAGE = 16
MODEL = random_model(PRESETS["tiny"], seed=0)


def make_engine(enable: bool, num_blocks: int = 64, context_length: int = 256) -> tuple[Engine, list[StepRecord]]:
    cache = KVCache(PRESETS["tiny"], num_blocks=num_blocks, block_size=PAGE, dtype=torch.float32,
                    device=torch.device("cpu"))
    engine = Engine(MODEL, cache, context_length=context_length, chunked_prefill_size=32, cuda_graphs=False,
                    enable_prefix_caching=enable)
    records: list[StepRecord] = []
    engine.step_listeners.append(records.append)
    return engine, records


@contextlib.contextmanager
def running(engine: Engine):
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()


def serve(engine: Engine, wave: list[tuple[list[int], SamplingParams]]) -> list[list[int]]:
    """Submit a wave's requests together and wait for them all to end; each one's tokens."""
    sinks = [queue.Queue() for _ in wave]
    for (prompt, params), sink in zip(wave, sinks, strict=True):
        engine.submit(prompt, params, [], sink.put)
    out = []
    for sink in sinks:
        got = []
        while True:
            ev = sink.get(timeout=120)
            assert ev.error is None, ev.error
            got.append(ev.token_id)
            if ev.finish_reason is not None:
                break
        out.append(got)
    return out


def run_waves(engine: Engine, waves: list[list[tuple[list[int], SamplingParams]]]) -> list[list[int]]:
    """Each wave's requests together, the next wave once they have all ended; every request's tokens."""
    with running(engine):
        return [tokens for wave in waves for tokens in serve(engine, wave)]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def tokens(n: int, salt: int) -> list[int]:
    return [(31 * i + 7 * salt) % 250 + 2 for i in range(n)]


BASE = [256] + tokens(39, 0)  # 40 tokens: two full pages and 8 tokens of a third


def hits(records: list[StepRecord]) -> tuple[int, int]:
    return sum(r.num_prefix_query_tokens for r in records), sum(r.num_prefix_hit_tokens for r in records)


def test_a_prompt_sharing_two_pages_and_part_of_a_third_hits_exactly_two_pages():
    engine, records = make_engine(enable=True)
    second = BASE[:40] + tokens(5, 1)  # the same 40 tokens, then others: page 2 is not full in the first
    run_waves(engine, [[(BASE, greedy(1))], [(second, greedy(1))]])
    assert hits(records) == (40 + 45, 2 * PAGE)
    # the second request's prefill computed its 13 tokens past the hit, not its 45
    assert [r.num_tokens for r in records if r.kind == "prefill"] == [32, 8, 45 - 2 * PAGE]


def test_greedy_tokens_are_the_same_with_the_cache_on_and_off():
    follow = [
        [(BASE + tokens(9, 2), greedy(12)), (BASE[:36] + tokens(20, 3), greedy(12))],  # share 2 pages, 2 + part
        [(BASE + tokens(9, 2), greedy(12)),  # the same prompt again: all but its last page
         (BASE + tokens(30, 4), greedy(8)), (BASE[:20] + tokens(3, 5), greedy(8))],
    ]
    waves = [[(BASE, greedy(20))], *follow]
    on_engine, on_records = make_engine(enable=True)
    on = run_waves(on_engine, waves)
    off_engine, off_records = make_engine(enable=False)
    off = run_waves(off_engine, waves)
    assert on == off
    queries, hit = hits(on_records)
    # wave 1: 2 + 2 pages; wave 2: 3 (49 tokens) + 2 + 1
    assert hit == (2 + 2 + 3 + 2 + 1) * PAGE and queries == sum(len(p) for wave in waves for p, _ in wave)
    assert hits(off_records) == (0, 0)
    computed = sum(r.num_tokens - r.num_decode_tokens for r in on_records)
    assert computed == sum(r.num_tokens - r.num_decode_tokens for r in off_records) - hit


def test_multi_turn_history_hits_the_pages_of_the_previous_reply():
    served = []
    for enable in (True, False):
        engine, records = make_engine(enable)
        with running(engine):
            [first] = serve(engine, [(BASE, greedy(41))])
            turn2 = BASE + first + tokens(6, 6)  # the history (81 tokens) and a new message
            [second] = serve(engine, [(turn2, greedy(10))])
        served.append((first, second))
        if enable:
            # the first request's 80 computed tokens fill 5 pages, the last one by its 40th reply token,
            # which was still on the device when that step was scheduled: it registered as the request ended
            assert hits(records) == (40 + 87, 5 * PAGE)
    assert served[0] == served[1]


def test_seeded_sampling_draws_the_same_tokens_with_the_cache_on_and_off():
    seeded = [SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=s, ignore_eos=True) for s in (1, 2)]
    waves = [[(BASE, seeded[0])], [(BASE + tokens(4, 7), seeded[1]), (BASE, seeded[0])]]
    on_engine, on_records = make_engine(enable=True)
    off_engine, _ = make_engine(enable=False)
    on, off = run_waves(on_engine, waves), run_waves(off_engine, waves)
    assert on == off and on[0] == on[2]
    assert hits(on_records)[1] == (2 + 2) * PAGE


def test_preempted_requests_sharing_pages_serve_what_they_serve_without_the_cache():
    # 12 pages of 16 tokens; four 40-token prompts sharing 2 pages grow to 100 tokens each: preemptions
    wave = [(BASE[:32] + tokens(8, 10 + i), greedy(60)) for i in range(4)]
    waves = [[(BASE, greedy(1))], wave]
    on_engine, on_records = make_engine(enable=True, num_blocks=12, context_length=128)
    off_engine, off_records = make_engine(enable=False, num_blocks=12, context_length=128)
    on, off = run_waves(on_engine, waves), run_waves(off_engine, waves)
    assert on == off
    assert sum(r.num_preemptions for r in on_records) > 0 and sum(r.num_preemptions for r in off_records) > 0
    queries, hit = hits(on_records)
    assert hit >= 4 * 2 * PAGE and queries > sum(len(p) for wave in waves for p, _ in wave)  # resumes looked up too
    assert on_engine.block_manager.num_free_blocks == on_engine.block_manager.num_blocks
    assert all(c == 0 for c in on_engine.block_manager.ref_counts)
