"""Scheduler: running requests decode every step, prompt chunks fill the rest of the token budget, the
newest is preempted when pages run out."""

from rooftop.engine.kv.block_manager import BlockManager
from rooftop.engine.scheduler import Scheduler, SchedulerConfig
from rooftop.engine.sequence import SamplingParams, Sequence, SequenceStatus


def make(num_blocks=16, block_size=4, max_running=8, chunk=8) -> Scheduler:
    # pages as plain pages, so equal prompts recompute: tests/engine/test_prefix_cache.py covers sharing them
    return Scheduler(SchedulerConfig(max_running, chunk), BlockManager(num_blocks, block_size, enable_prefix_caching=False))


def seq(n: int) -> Sequence:
    return Sequence(list(range(n)), SamplingParams())


def step(s: Scheduler, next_token: int = 7) -> tuple[list[tuple[int, int]], bool]:
    """One schedule + postprocess, appending a token to each sequence that completed; (seq_id, n) pairs."""
    batch, is_prefill = s.schedule()
    picked = [(q.seq_id, q.num_scheduled_tokens) for q in batch]
    for q in s.postprocess(batch):
        q.append_token(next_token)
    return picked, is_prefill


def test_prefill_admits_while_budget_lasts_then_decodes():
    s = make(chunk=8)
    a, b, c = seq(3), seq(4), seq(5)
    for q in (a, b, c):
        s.add(q)
    picked, is_prefill = step(s)
    # a (3) + b (4) = 7, then c gets the last token of the budget: a chunk of 1
    assert is_prefill and picked == [(a.seq_id, 3), (b.seq_id, 4), (c.seq_id, 1)]
    assert a.num_completion_tokens == 1 and b.num_completion_tokens == 1 and c.num_completion_tokens == 0
    assert c.num_cached_tokens == 1 and c.is_prefilling and c.status == SequenceStatus.RUNNING
    picked, is_prefill = step(s)
    # a and b decode; the cut prompt goes on in the same step
    assert is_prefill and picked == [(a.seq_id, 1), (b.seq_id, 1), (c.seq_id, 4)]
    picked, is_prefill = step(s)
    assert not is_prefill and picked == [(a.seq_id, 1), (b.seq_id, 1), (c.seq_id, 1)]
    assert (a.num_tokens, a.num_cached_tokens) == (6, 5)


def test_decodes_take_their_tokens_from_the_budget_first():
    s = make(num_blocks=32, chunk=8)
    running = [seq(2) for _ in range(3)]
    for q in running:
        s.add(q)
    step(s)  # the three prompts, 6 tokens
    late = seq(20)
    s.add(late)
    picked, is_prefill = step(s)
    # three decode tokens, then 5 of the new prompt's 20: 8 in all
    assert is_prefill and picked == [*((q.seq_id, 1) for q in running), (late.seq_id, 5)]
    s2 = make(num_blocks=32, chunk=2)
    for q in (a := [seq(1) for _ in range(3)]):
        s2.add(q)
    step(s2)  # a budget of 2: two of the prompts
    picked, is_prefill = step(s2)  # the two decode and use up the budget: the third waits
    assert not is_prefill and picked == [(a[0].seq_id, 1), (a[1].seq_id, 1)] and list(s2.waiting) == [a[2]]


def test_long_prompt_is_chunked_by_the_budget():
    s = make(num_blocks=16, chunk=8)
    a = seq(20)
    s.add(a)
    assert [step(s)[0] for _ in range(3)] == [[(a.seq_id, 8)], [(a.seq_id, 8)], [(a.seq_id, 4)]]
    assert a.num_completion_tokens == 1 and len(a.block_table) == 5


def test_max_running_requests_caps_admission():
    s = make(max_running=2, chunk=64)
    qs = [seq(2) for _ in range(3)]
    for q in qs:
        s.add(q)
    picked, _ = step(s)
    assert [p[0] for p in picked] == [qs[0].seq_id, qs[1].seq_id] and list(s.waiting) == [qs[2]]
    s.finish(qs[0], "length")
    picked, is_prefill = step(s)
    assert is_prefill and picked == [(qs[1].seq_id, 1), (qs[2].seq_id, 2)]


def test_full_cache_preempts_newest_which_recomputes_its_tokens():
    # 4 pages of 2 tokens: two 4-token prompts fill them; the first sampled tokens need a third page each
    s = make(num_blocks=4, block_size=2, chunk=64)
    old, new = seq(4), seq(4)
    s.add(old)
    s.add(new)
    step(s)  # prefill both: 5 tokens each after sampling, 4 cached
    assert s.block_manager.num_free_blocks == 0
    picked, is_prefill = step(s)  # old needs a page for token 5 -> none free -> new is preempted
    assert not is_prefill and picked == [(old.seq_id, 1)]
    assert s.num_preemptions == 1 and new.status == SequenceStatus.WAITING and new.block_table == []
    assert new.num_cached_tokens == 0 and new.num_tokens == 5  # its sampled token is kept
    assert list(s.waiting) == [new] and len(old.block_table) == 3
    s.finish(old, "length")
    picked, is_prefill = step(s)  # recompute: all 5 tokens, then it samples its 6th
    assert is_prefill and picked == [(new.seq_id, 5)] and new.num_tokens == 6


def test_decode_preempts_the_newest_running_sequence():
    s = make(num_blocks=3, block_size=2, chunk=64)
    a = seq(3)
    s.add(a)
    step(s)  # a: 3 cached in 2 pages
    b = seq(1)
    s.add(b)
    picked, is_prefill = step(s)  # a decodes at position 3 (its 2nd page); b is admitted into the last one
    assert is_prefill and picked == [(a.seq_id, 1), (b.seq_id, 1)]
    picked, is_prefill = step(s)  # a needs a third page: b (newest) gives its page back, and cannot come back
    assert not is_prefill and picked == [(a.seq_id, 1)]
    assert b.status == SequenceStatus.WAITING and s.num_preemptions == 1 and list(s.waiting) == [b]


def test_a_stalled_half_prefilled_prompt_is_the_first_to_give_way():
    s = make(num_blocks=5, block_size=2, chunk=4)
    a, c = seq(3), seq(1)
    s.add(a)
    s.add(c)
    step(s)  # a: 3 cached in 2 pages; c: 1 in 1; both decoding
    b = seq(6)
    s.add(b)
    picked, is_prefill = step(s)  # a and c decode; b's first chunk (2 tokens, the budget's rest) takes a page
    assert is_prefill and picked == [(a.seq_id, 1), (c.seq_id, 1), (b.seq_id, 2)] and b.is_prefilling
    picked, is_prefill = step(s)  # a takes the last free page, c needs one more: the half-prefilled b gives way
    assert not is_prefill and picked == [(a.seq_id, 1), (c.seq_id, 1)]
    assert b.status == SequenceStatus.WAITING and b.num_cached_tokens == 0 and s.num_preemptions == 1
    assert c.status == SequenceStatus.RUNNING


def test_finish_frees_pages():
    s = make()
    a = seq(8)
    s.add(a)
    step(s)
    assert s.block_manager.num_free_blocks == 16 - 2
    s.finish(a, "stop")
    assert s.block_manager.num_free_blocks == 16 and not s.has_work() and a.finish_reason == "stop"
