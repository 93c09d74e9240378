"""Prefix cache bookkeeping: full computed pages register under a chained hash, a new sequence takes the
longest cached run of its first pages, pages are shared by count, and freed ones stay cached until
evicted least recently freed first. Real BlockManager and Scheduler objects."""

import pytest

from rooftop.engine.kv.block_manager import BlockManager
from rooftop.engine.scheduler import Scheduler, SchedulerConfig
from rooftop.engine.sequence import PENDING_TOKEN, SamplingParams, Sequence, SequenceStatus

B = 4  # tokens a page


def seq(tokens: list[int]) -> Sequence:
    return Sequence(list(tokens), SamplingParams())


def computed(bm: BlockManager, s: Sequence, num_tokens: int | None = None) -> Sequence:
    """Give s (holding no pages) its cached prefix and pages for its tokens, as if a step computed them."""
    n = s.num_tokens if num_tokens is None else num_tokens
    bm.allocate(s, bm.cached_prefix(s), n)
    s.num_cached_tokens = n
    bm.cache_full_pages(s)
    return s


PROMPT = list(range(100, 111))  # 11 tokens: two full pages and 3 tokens of a third


def test_a_sequence_sharing_full_pages_takes_them_and_the_page_count_follows():
    bm = BlockManager(num_blocks=8, block_size=B)
    a = computed(bm, seq(PROMPT))
    assert a.block_table == [0, 1, 2] and bm.num_free_blocks == 5
    b = seq(PROMPT[:10] + [7, 8])  # the same two full pages, then other tokens in the third
    hit = bm.cached_prefix(b)
    assert hit == [0, 1]
    bm.allocate(b, hit, b.num_tokens)
    assert b.block_table == [0, 1, 3] and b.num_cached_tokens == 2 * B
    assert [bm.ref_counts[i] for i in range(4)] == [2, 2, 1, 1] and bm.num_free_blocks == 4


def test_the_third_page_being_written_is_never_shared():
    bm = BlockManager(num_blocks=8, block_size=B)
    computed(bm, seq(PROMPT))  # its third page holds 3 tokens: not registered
    same = seq(PROMPT + [1, 2])  # the same 11 tokens and more
    assert bm.cached_prefix(same) == [0, 1]


def test_a_hit_covers_the_whole_prefix_not_a_page_alone():
    bm = BlockManager(num_blocks=8, block_size=B)
    computed(bm, seq(PROMPT))
    other_head = seq([9, 9, 9, 9] + PROMPT[4:])  # page 1's tokens equal, page 0's not
    assert bm.cached_prefix(other_head) == []


def test_at_least_the_last_token_is_left_to_compute():
    bm = BlockManager(num_blocks=8, block_size=B)
    computed(bm, seq(PROMPT[:8]))  # two full pages
    again = seq(PROMPT[:8])
    assert bm.cached_prefix(again) == [0]  # its last token is in page 1: that page is computed again
    assert bm.cached_prefix(seq(PROMPT[:9])) == [0, 1]


def test_a_page_is_held_until_its_last_holder_frees_it_then_stays_cached():
    bm = BlockManager(num_blocks=6, block_size=B)
    a = computed(bm, seq(PROMPT))
    b = computed(bm, seq(PROMPT[:9]))
    assert b.block_table == [0, 1, 3] and bm.ref_counts[:2] == [2, 2]
    bm.free(a)
    # a's third page (3 tokens, unregistered) is empty again; its first two are still b's
    assert bm.ref_counts[:3] == [1, 1, 0] and list(bm.cached_free) == [] and 2 in bm.free_block_ids
    bm.free(b)  # b's third page holds one token: empty; pages 0 and 1 are cached, unheld
    assert bm.ref_counts == [0] * 6 and sorted(bm.cached_free) == [0, 1]
    assert bm.num_free_blocks == 6 and bm.usage == 0.0
    c = seq(PROMPT + [5])
    hit = bm.cached_prefix(c)
    assert hit == [0, 1] and bm.can_allocate(c, hit, 12)
    bm.allocate(c, hit, 12)
    assert c.block_table[:2] == [0, 1] and list(bm.cached_free) == [] and bm.num_free_blocks == 3


def test_taking_unheld_cached_pages_counts_against_the_free_ones():
    bm = BlockManager(num_blocks=3, block_size=B)
    a = computed(bm, seq(PROMPT[:9]))  # pages 0, 1 full, page 2 one token
    bm.free(a)
    b = seq(PROMPT[:8] + [1, 2, 3, 4, 5])  # 13 tokens: hits 2 pages, needs 2 more; 1 is left
    hit = bm.cached_prefix(b)
    assert hit == [0, 1] and bm.num_free_blocks == 3
    assert not bm.can_allocate(b, hit, 13) and bm.can_allocate(b, hit, 12)


def test_eviction_takes_empty_pages_first_then_the_least_recently_freed_tail_first():
    bm = BlockManager(num_blocks=6, block_size=B)
    old = computed(bm, seq(list(range(8))))  # pages 0, 1
    new = computed(bm, seq(list(range(50, 58))))  # pages 2, 3
    bm.free(old)
    bm.free(new)
    assert list(bm.cached_free) == [1, 0, 3, 2]  # old's before new's; each one's tail before its head
    x = seq([7] * 12)
    bm.grow(x, 12)  # the two empty pages, then old's tail page
    assert x.block_table == [4, 5, 1]
    assert bm.cached_prefix(seq(list(range(9)))) == [0]  # old's head is still cached, its tail is not
    bm.grow(x, 16)
    assert x.block_table[-1] == 0 and bm.cached_prefix(seq(list(range(9)))) == []
    assert bm.cached_prefix(seq(list(range(50, 59)))) == [2, 3]  # the newer prefix survived


def test_pages_computed_twice_at_once_keep_one_registration():
    bm = BlockManager(num_blocks=8, block_size=B)
    a, b = seq(PROMPT), seq(PROMPT)
    for s in (a, b):  # both admitted in one step: neither could hit the other
        bm.allocate(s, [], s.num_tokens)
    for s in (a, b):
        s.num_cached_tokens = s.num_tokens
        bm.cache_full_pages(s)
    assert a.block_table == [0, 1, 2] and b.block_table == [3, 4, 5]
    assert bm.cached_prefix(seq(PROMPT)) == [0, 1]
    bm.free(b)  # its copies are not the registered ones: empty again
    assert list(bm.cached_free) == [] and bm.num_free_blocks == 5
    bm.free(a)
    assert sorted(bm.cached_free) == [0, 1]


def test_a_page_whose_last_token_is_still_on_the_device_registers_once_it_is_back():
    bm = BlockManager(num_blocks=8, block_size=B)
    s = computed(bm, seq(PROMPT))  # 11 tokens cached
    s.append_token(PENDING_TOKEN)  # the decode step that writes token 11 fills page 2
    bm.grow(s, 12)
    s.num_cached_tokens = 12
    bm.cache_full_pages(s)
    assert bm.block_hash[2] is None
    s.token_ids[11] = 42  # its pick came back
    s.append_token(PENDING_TOKEN)
    bm.grow(s, 13)
    s.num_cached_tokens = 13
    bm.cache_full_pages(s)  # the next step's
    assert bm.cached_prefix(seq(PROMPT + [42, 1])) == [0, 1, 2]


def test_pages_imported_from_a_prefill_worker_are_never_offered():
    bm = BlockManager(num_blocks=8, block_size=B)
    computed(bm, seq(PROMPT[:8]))  # this engine's own: pages 0 and 1, still held
    imported = seq(PROMPT[:4] + [1, 2, 3, 4, 5])
    assert bm.adopt(imported, 9) == [2, 3, 4] and imported.imported
    imported.append_token(6)
    bm.grow(imported, 10)
    imported.num_cached_tokens = 10  # a decode step went by
    bm.cache_full_pages(imported)
    assert bm.cached_prefix(seq(PROMPT[:4] + [1, 2, 3, 4, 5, 6])) == [0]  # the local page 0 only
    bm.free(imported)
    assert list(bm.cached_free) == [] and sorted(bm.free_block_ids) == [2, 3, 4, 5, 6, 7]
    # preempted and recomputed here, it may still hit this engine's pages
    assert bm.cached_prefix(imported) == [0]


def test_off_it_neither_hits_nor_keeps_pages():
    bm = BlockManager(num_blocks=4, block_size=B, enable_prefix_caching=False)
    a = computed(bm, seq(PROMPT))
    assert bm.cached_prefix(seq(PROMPT)) == []
    bm.free(a)
    assert list(bm.cached_free) == [] and sorted(bm.free_block_ids) == [0, 1, 2, 3]


# ---- the scheduler ------------------------------------------------------------------------------
def make(num_blocks=16, chunk=64, enable=True) -> Scheduler:
    return Scheduler(SchedulerConfig(8, chunk), BlockManager(num_blocks, B, enable_prefix_caching=enable))


def step(s: Scheduler, next_token: int = 7) -> list[tuple[int, int]]:
    batch, _ = s.schedule()
    picked = [(q.seq_id, q.num_scheduled_tokens) for q in batch]
    for q in s.postprocess(batch):
        q.append_token(next_token)
    return picked


@pytest.mark.parametrize("enable", [True, False])
def test_a_prompt_after_one_sharing_two_pages_and_part_of_a_third_computes_the_rest(enable):
    s = make(enable=enable)
    a, b = seq(PROMPT), seq(PROMPT[:10] + [1, 2, 3])
    s.add(a)
    assert step(s) == [(a.seq_id, 11)]
    s.add(b)
    picked = step(s)
    if enable:
        assert picked == [(a.seq_id, 1), (b.seq_id, 13 - 2 * B)]
        assert (s.num_prefix_query_tokens, s.num_prefix_hit_tokens) == (11 + 13, 2 * B)
        assert b.block_table[:2] == a.block_table[:2]
    else:
        assert picked == [(a.seq_id, 1), (b.seq_id, 13)]
        assert (s.num_prefix_query_tokens, s.num_prefix_hit_tokens) == (0, 0)
        assert not set(b.block_table) & set(a.block_table)


def test_a_prompt_that_cannot_be_admitted_is_not_counted_until_it_is():
    s = make(num_blocks=4, chunk=64)
    a = seq(list(range(12)))
    s.add(a)
    step(s)  # 3 pages
    b = seq(list(range(8)) + [1] * 8)  # hits 2 pages, needs 2 more: one is free
    s.add(b)
    assert step(s) == [(a.seq_id, 1)] and list(s.waiting) == [b]  # a's 13th token takes the last page
    assert (s.num_prefix_query_tokens, s.num_prefix_hit_tokens) == (12, 0)
    s.finish(a, "stop")
    assert step(s) == [(b.seq_id, 8)]
    assert (s.num_prefix_query_tokens, s.num_prefix_hit_tokens) == (12 + 16, 8)


def test_a_preempted_sequence_leaves_shared_pages_to_the_other_and_finds_its_own_again():
    # 5 pages: a (9 tokens) holds 3, b shares a's first 2 and holds 1 of its own
    s = make(num_blocks=5, chunk=64)
    a, b = seq(PROMPT[:9]), seq(PROMPT[:8] + [60, 61, 62])
    s.add(a)
    step(s)
    s.add(b)
    assert step(s) == [(a.seq_id, 1), (b.seq_id, 3)]
    shared = a.block_table[:2]
    assert b.block_table[:2] == shared and [s.block_manager.ref_counts[p] for p in shared] == [2, 2]
    step(s)
    step(s)  # a: 13 tokens, 12 cached, in 3 pages; b: 14 tokens, 13 cached: its 13th took the last page
    assert s.block_manager.num_free_blocks == 0 and (a.num_tokens, b.num_tokens) == (13, 14)
    # a's 13th token needs a 4th page: none is free, and b (newest) gives its pages back
    assert step(s) == [(a.seq_id, 1)]
    assert b.status == SequenceStatus.WAITING and b.block_table == [] and s.num_preemptions == 1
    assert [s.block_manager.ref_counts[p] for p in shared] == [1, 1]  # a still holds them
    # b's third page (tokens 8..11) was full: it stays cached, unheld; a took b's last (one-token) page
    assert list(s.block_manager.cached_free) == [s.block_manager.hash_to_block[b.block_hashes[2]]]
    assert list(s.waiting) == [b]  # a hit of 3 pages leaves 2 tokens: a 4th page and its own 3rd, 1 free
    s.finish(a, "length")
    queries, hits = s.num_prefix_query_tokens, s.num_prefix_hit_tokens
    assert step(s) == [(b.seq_id, 2)]  # 12 of its 14 tokens are cached: a's two pages and its own third
    assert (s.num_prefix_query_tokens - queries, s.num_prefix_hit_tokens - hits) == (14, 12)
    assert b.block_table[:2] == shared and b.num_tokens == 15
