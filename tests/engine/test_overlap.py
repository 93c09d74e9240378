"""The engine launches step N+1 before it reads step N's picks, and what it serves is what a step at a
time would serve: the same greedy tokens, no step for a request already ended by length, and no token
handed out past an end. Prompt chunks ride with the running requests' decodes; a failed chunk fails
only its prompt."""

import queue

import pytest
import torch

from rooftop.engine.engine import Engine
from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.config import PRESETS
from rooftop.engine.model.weights import random_model
from rooftop.engine.sampler import PendingSample
from rooftop.engine.sequence import PENDING_TOKEN, SamplingParams, Sequence


def make_engine(**kwargs) -> Engine:
    torch.manual_seed(0)
    config = PRESETS["tiny"]
    model = random_model(config, seed=0)
    cache = KVCache(config, num_blocks=64, block_size=16, dtype=torch.float32, device=torch.device("cpu"))
    return Engine(model, cache, context_length=256, chunked_prefill_size=32, cuda_graphs=False, **kwargs)


def collect(engine: Engine, prompts: list[list[int]], params: list[SamplingParams], stops=None) -> list[list]:
    """Submit all prompts, run the engine thread until every request has ended; each request's events."""
    sinks = [queue.Queue() for _ in prompts]
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.submit(prompt, p, (stops or [[]] * len(prompts))[i], sinks[i].put)
    engine.start()
    try:
        events = []
        for sink in sinks:
            got = [sink.get(timeout=60)]
            while got[-1].finish_reason is None:
                got.append(sink.get(timeout=60))
            events.append(got)
        return events
    finally:
        engine.stop()


@pytest.fixture
def trace(monkeypatch):
    """The order of launches (runner.run) and read-backs (PendingSample.result) the engine makes."""
    order: list[str] = []
    result = PendingSample.result

    def reading(self):
        order.append("read")
        return result(self)

    monkeypatch.setattr(PendingSample, "result", reading)
    return order


def prompts(n: int, length: int = 20) -> list[list[int]]:
    return [[1] + [(7 * i + 3 * j) % 250 + 2 for j in range(length)] for i in range(n)]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def test_next_step_is_launched_before_the_previous_picks_are_read(trace):
    engine = make_engine()
    run = engine.runner.run

    def launching(*args, **kwargs):
        trace.append("launch")
        return run(*args, **kwargs)

    engine.runner.run = launching
    [events] = collect(engine, prompts(1), [greedy(6)])
    assert [e.num_completion_tokens for e in events] == [1, 2, 3, 4, 5, 6]
    assert events[-1].finish_reason == "length"
    # one prefill and five decode steps, each launched before the step before it is read; the sixth
    # token is the last by length, so no step follows it
    assert trace == ["launch", "launch", "read", "launch", "read", "launch", "read", "launch", "read",
                     "launch", "read", "read"]


def test_overlapped_tokens_equal_one_step_at_a_time(monkeypatch):
    params = [greedy(n) for n in (3, 9, 1, 12)]
    overlapped = collect(make_engine(), prompts(4), params)

    # a step at a time: every step's picks are read before the next is scheduled
    engine = make_engine()
    launch = engine._launch

    def launch_then_complete(previous):
        launched = launch(previous)
        if launched is not None:
            engine._complete(launched)
        return None

    monkeypatch.setattr(engine, "_launch", launch_then_complete)
    serial = collect(engine, prompts(4), params)
    assert [[e.token_id for e in events] for events in overlapped] == [[e.token_id for e in ev] for ev in serial]
    assert [len(events) for events in overlapped] == [3, 9, 1, 12]
    assert all(PENDING_TOKEN not in (e.token_id for e in events) for events in overlapped)


def test_a_stop_seen_a_step_late_hands_out_nothing_after_it():
    # greedy tokens of the first request, then stop at its third token's text: the engine learns of
    # the stop after it launched a fourth step, whose pick must not reach the client
    engine = make_engine()
    [events] = collect(engine, prompts(1), [greedy(8)])
    text = "".join(e.text for e in events)
    assert len(text) >= 3, "the random model's first tokens must be bytes for this test"
    stop = text[2]
    first = text.index(stop)
    engine = make_engine()
    [stopped] = collect(engine, prompts(1), [SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)],
                        stops=[[stop]])
    assert stopped[-1].finish_reason == "stop"
    assert "".join(e.text for e in stopped) == text[:first]
    assert stopped[-1].num_completion_tokens == first + 1
    assert engine.num_running == 0 and engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_long_prompt_does_not_stall_a_running_request():
    """A 200-token prompt arriving while a request decodes is prefilled in 32-token chunks, each step
    also carrying the running request's next token (chunked prefill mixed into decode steps)."""
    engine = make_engine()
    records = []
    engine.step_listeners.append(records.append)
    sinks = [queue.Queue(), queue.Queue()]
    engine.submit(prompts(1)[0], greedy(30), [], sinks[0].put)
    engine.start()
    try:
        first = sinks[0].get(timeout=60)  # the short request is decoding
        assert first.finish_reason is None
        engine.submit(prompts(1, length=200)[0], greedy(2), [], sinks[1].put)
        done = []
        for sink in sinks:
            while not (ev := sink.get(timeout=60)).finish_reason:
                pass
            done.append(ev)
    finally:
        engine.stop()
    assert [ev.finish_reason for ev in done] == ["length", "length"]
    chunks = [r for r in records if r.kind == "prefill" and r.num_tokens - r.num_decode_tokens > 1]
    long_chunks = [r for r in chunks if r.num_seqs == 2]
    # 201 prompt tokens in chunks of 31 (one of each step's 32 goes to the running request)
    assert len(long_chunks) >= 6 and all(r.num_decode_tokens == 1 for r in long_chunks)
    assert all(r.num_tokens <= 32 for r in records)


def test_a_failed_prefill_step_fails_its_prompts_and_the_decodes_go_on(monkeypatch):
    engine = make_engine()
    run = engine.runner.run
    failed_once = []

    def failing(seqs, is_prefill, previous=None):
        if is_prefill and any(s.num_prompt_tokens == 51 for s in seqs) and not failed_once:
            failed_once.append(len(seqs))
            raise RuntimeError("out of memory (simulated)")
        return run(seqs, is_prefill, previous)

    engine.runner.run = failing
    sinks = [queue.Queue(), queue.Queue()]
    engine.submit(prompts(1)[0], greedy(12), [], sinks[0].put)
    engine.start()
    try:
        assert sinks[0].get(timeout=60).finish_reason is None  # decoding
        engine.submit(prompts(1, length=50)[0], greedy(4), [], sinks[1].put)
        doomed = sinks[1].get(timeout=60)
        running = [sinks[0].get(timeout=60)]
        while running[-1].finish_reason is None:
            running.append(sinks[0].get(timeout=60))
    finally:
        engine.stop()
    assert failed_once == [2]  # the prompt's first chunk rode with the running request's decode
    assert doomed.finish_reason == "error" and "out of memory (simulated)" in doomed.error
    assert running[-1].finish_reason == "length" and running[-1].num_completion_tokens == 12
    reference = collect(make_engine(), prompts(1), [greedy(12)])[0]
    assert [e.token_id for e in running] == [e.token_id for e in reference[1:]]


def test_prompt_tokens_recomputed_for_an_imported_sequence_are_counted():
    """PD decode: a sequence whose KV came from a prefill worker, preempted and recomputed here, counts
    its recomputed prompt tokens (num_imported_prompt_tokens); its decode tokens do not."""
    torch.manual_seed(0)
    config = PRESETS["tiny"]
    cache = KVCache(config, num_blocks=8, block_size=16, dtype=torch.float32, device=torch.device("cpu"))
    engine = Engine(random_model(config, seed=0), cache, context_length=128, chunked_prefill_size=32,
                    cuda_graphs=False)
    records = []
    engine.step_listeners.append(records.append)
    older, adopted = queue.Queue(), queue.Queue()
    engine.submit(prompts(1, length=29)[0], greedy(60), [], older.put)  # 30 + 60 tokens: 6 pages at the end
    engine.start()
    try:
        assert older.get(timeout=60).finish_reason is None
        seq = Sequence(prompts(1, length=39)[0], greedy(30))  # 40 + 30 tokens: up to 5 pages; 8 in all
        engine.adopt(seq, [], adopted.put, lambda s: None, (7, -0.5, [])).result(timeout=60)
        for sink in (older, adopted):
            while not (ev := sink.get(timeout=60)).finish_reason:
                pass
            assert ev.finish_reason == "length"
    finally:
        engine.stop()
    assert engine.scheduler.num_preemptions >= 1
    recomputed = sum(r.num_imported_prompt_tokens for r in records)
    assert recomputed >= 41  # its 40 prompt tokens and the first token, at least once
    assert all(r.num_imported_prompt_tokens <= r.num_tokens - r.num_decode_tokens for r in records)
