"""BlockManager: pages handed out and returned exactly, slots where the model will write."""

import pytest

from rooftop.engine.kv.block_manager import BlockManager, blocks_for
from rooftop.engine.sequence import SamplingParams, Sequence


def seq(n: int) -> Sequence:
    return Sequence(list(range(n)), SamplingParams())


def test_blocks_for_rounds_up():
    assert [blocks_for(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_grow_takes_only_missing_pages_and_free_returns_them():
    bm = BlockManager(num_blocks=5, block_size=4, enable_prefix_caching=False)  # freed pages all come back empty
    a, b = seq(6), seq(3)
    bm.grow(a, 6)
    assert a.block_table == [0, 1] and bm.num_free_blocks == 3
    bm.grow(a, 8)  # still fits in 2 pages
    assert a.block_table == [0, 1]
    bm.grow(a, 9)
    assert a.block_table == [0, 1, 2]
    bm.grow(b, 3)
    assert b.block_table == [3] and bm.usage == pytest.approx(0.8)
    assert not bm.can_grow(b, 12) and bm.can_grow(b, 8)
    with pytest.raises(RuntimeError):
        bm.grow(b, 16)
    a.num_cached_tokens = 9
    bm.free(a)
    assert a.block_table == [] and a.num_cached_tokens == 0 and bm.num_free_blocks == 4
    # all five ids are back, none twice
    bm.free(b)
    assert sorted(bm.free_block_ids) == [0, 1, 2, 3, 4]


def test_slot_is_page_times_size_plus_offset():
    bm = BlockManager(num_blocks=8, block_size=4)
    s = seq(10)
    bm.free_block_ids.rotate(-5)  # hand out pages 5, 6, 7 first
    bm.grow(s, 10)
    assert s.block_table == [5, 6, 7]
    assert [bm.slot(s, p) for p in (0, 3, 4, 9)] == [20, 23, 24, 29]


def test_adopt_gives_pages_for_imported_tokens():
    bm = BlockManager(num_blocks=4, block_size=4)
    s = seq(7)
    ids = bm.adopt(s, 7)
    assert ids == [0, 1] and s.num_cached_tokens == 7
    with pytest.raises(RuntimeError):
        bm.adopt(s, 7)


def test_rejects_empty_cache():
    with pytest.raises(ValueError):
        BlockManager(0, 4)
