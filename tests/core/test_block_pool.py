"""BlockPool on its own: the free queue's order, eviction through the hook before a cached
block changes hands, reference counts, and copy-on-write copies that belong to whoever holds
their destination."""

from __future__ import annotations

from minivllm.core.block_pool import BlockPool


def pool(num_blocks: int = 4) -> tuple[BlockPool, list[tuple[int, int]]]:
    """A pool whose evictions are recorded as (block, its reference count then)."""
    evicted: list[tuple[int, int]] = []
    made = BlockPool(num_blocks, evict=lambda b: evicted.append((b, made.blocks[b].ref_cnt)))
    return made, evicted


def register(p: BlockPool, block_id: int) -> None:
    p.blocks[block_id].hash = 1000 + block_id  # what the prefix cache does


def test_blocks_are_taken_least_recently_used_first():
    p, evicted = pool()
    assert [p.take(), p.take()] == [0, 1] and p.num_free == 2
    assert [m.ref_cnt for m in p.blocks] == [1, 1, 0, 0] and evicted == []


def test_release_sends_plain_blocks_to_the_front_and_cached_ones_to_the_back():
    p, _ = pool()
    taken = [p.take() for _ in range(3)]
    register(p, taken[0])
    register(p, taken[1])
    p.release(taken)  # tail first: 2 (plain) to the front, then 1, then 0 at the back
    assert list(p.free_queue) == [2, 3, 1, 0]


def test_taking_a_cached_block_evicts_it_before_it_has_a_new_owner():
    p, evicted = pool(1)
    register(p, p.take())
    p.release([0])
    assert p.take() == 0
    assert evicted == [(0, 0)]  # evicted while nobody held it
    p.blocks[0].hash = None
    p.release([0])
    p.take()
    assert evicted == [(0, 0)]  # a plain block is not evicted


def test_touch_takes_a_free_hit_back_and_counts_references():
    p, _ = pool(2)
    register(p, p.take())
    p.release([0])
    p.touch(0)
    p.touch(0)
    assert p.blocks[0].ref_cnt == 2 and list(p.free_queue) == [1]
    assert p.num_freed_by([0]) == 0
    p.release([0])
    assert p.num_freed_by([0]) == 1 and p.num_freed_by([0], keep={0}) == 0


def test_a_copy_belongs_to_its_destination_and_is_dropped_with_it():
    p, _ = pool()
    shared = p.take()
    p.touch(shared)  # two holders
    copy = p.take_copy_of(shared)
    assert p.blocks[shared].ref_cnt == 1 and p.blocks[copy].ref_cnt == 1
    assert p.source_of(copy) == shared and p.source_of(shared) == shared
    p.release([copy])  # the copy's holder let go before the step ran
    assert p.take_pending_copies() == [] and p.source_of(copy) == copy


def test_pending_copies_are_taken_once():
    p, _ = pool()
    shared = p.take()
    p.touch(shared)
    copy = p.take_copy_of(shared)
    assert p.take_pending_copies() == [(shared, copy)]
    assert p.take_pending_copies() == []


def test_reuse_first_and_keep_longest_reorder_only_free_blocks():
    p, _ = pool()
    held = p.take()
    p.reuse_first(held)
    assert held not in p.free_queue
    p.reuse_first(3)
    assert list(p.free_queue) == [3, 1, 2]
    assert p.keep_longest([held, 3]) == 1 and list(p.free_queue) == [1, 2, 3]


def test_free_hits_are_counted_again_when_a_hit_moves_or_an_eviction_happens():
    p, _ = pool()
    hits = [p.take(), p.take()]
    p.release(hits[1:])
    assert p.num_free_of(hits, num_evictions=0) == 1
    p.touch(hits[1])  # a move: counted again
    assert p.num_free_of(hits, num_evictions=0) == 0
    p.blocks[hits[0]].ref_cnt = 0  # behind the pool's back: the memo cannot see it ...
    assert p.num_free_of(hits, num_evictions=0) == 0
    assert p.num_free_of(hits, num_evictions=1) == 1  # ... until the cache's evictions move
