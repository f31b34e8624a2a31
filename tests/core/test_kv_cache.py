"""KVCacheManager on its own: allocation and free, prefix-cache registration, lookup and LRU
eviction, the host swap pool, fork and copy-on-write, and (hypothesis) that random sequences
of those operations never leak a block nor let two requests write one block."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.core.kv_cache import KVCacheManager
from minivllm.core.request import Request


def request(request_id: str, prompt: list[int], cache_salt: str | None = None,
            **fields) -> Request:
    return Request.make(request_id, prompt, max_tokens=8, arrival_time=0.0, cache_salt=cache_salt,
                   **fields)


def compute(kv: KVCacheManager, r: Request, num_new: int, cached: list[int] | None = None):
    """What the scheduler and runner do for one step of `r`: allocate, compute, register."""
    allocated = kv.allocate_slots(r, num_new, cached)
    assert allocated is not None
    r.num_computed_tokens += len(cached or []) * kv.block_size + num_new
    kv.cache_full_blocks(r)
    return allocated


def assert_accounting(kv: KVCacheManager, live: list[Request]) -> None:
    holders = Counter(b for r in live for b in r.block_ids)
    assert [m.ref_cnt for m in kv.blocks] == [holders[b] for b in range(kv.num_blocks)]
    assert set(kv.free_queue) == {b for b in range(kv.num_blocks) if not holders[b]}
    assert all(kv.blocks[b].hash == h for h, b in kv.cached.items())
    swap_held = [b for r in live for b in r.swap_block_ids]
    assert sorted(swap_held + kv.free_swap_blocks) == list(range(kv.num_swap_blocks))


# ---- allocation and free ------------------------------------------------------------------

def test_allocate_takes_the_blocks_the_tokens_need_and_free_gives_them_back():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    r = request("r", list(range(6)))
    assert kv.blocks_needed(6) == 2 and kv.can_allocate(r, 6)
    assert len(compute(kv, r, 6)) == 2
    assert kv.num_free_blocks == 2 and kv.usage == 0.5
    assert kv.allocate_slots(r, 2) == []  # position 7 still fits the second block
    r.num_computed_tokens += 2
    assert len(kv.allocate_slots(r, 1)) == 1  # the ninth token needs a third block
    kv.free(r)
    assert r.block_ids == [] and kv.num_free_blocks == 4
    assert all(m.ref_cnt == 0 for m in kv.blocks)


def test_an_allocation_that_does_not_fit_changes_nothing():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    r = request("r", list(range(12)))
    assert not kv.can_allocate(r, 12)
    assert kv.can_allocate(r, 12, extra_free=1)
    assert kv.allocate_slots(r, 12) is None
    assert r.block_ids == [] and kv.num_free_blocks == 2


def test_num_blocks_freed_by_counts_only_unshared_blocks_not_kept():
    kv = KVCacheManager(num_blocks=8, block_size=2)
    parent, child = request("p", [1, 2, 3, 4, 5]), request("c", [1, 2, 3, 4, 5])
    compute(kv, parent, 4)
    kv.fork(parent, child)
    compute(kv, parent, 1)  # a third block, the parent's own
    assert kv.num_blocks_freed_by(parent) == 1
    assert kv.num_blocks_freed_by(child) == 0
    kv.free(child)
    assert kv.num_blocks_freed_by(parent) == 3
    assert kv.num_blocks_freed_by(parent, keep={parent.block_ids[0]}) == 2


# ---- prefix cache ---------------------------------------------------------------------------

def test_full_computed_blocks_are_registered_and_found_by_a_later_request():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    first = request("a", list(range(10)))
    compute(kv, first, 10)
    assert len(kv.cached) == 2  # two full blocks; the partial third is not registered
    second = request("b", list(range(8)) + [99, 98, 97])
    hits = kv.find_cached_blocks(second)
    assert hits == first.block_ids[:2]
    assert kv.num_cached_tokens_probe(second) == 8
    compute(kv, second, 3, cached=hits)
    assert second.block_ids[:2] == first.block_ids[:2]
    assert [kv.blocks[b].ref_cnt for b in hits] == [2, 2]
    assert_accounting(kv, [first, second])


def test_a_hit_leaves_at_least_one_token_to_compute():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    compute(kv, request("a", list(range(8))), 8)
    same = request("b", list(range(8)))
    assert len(kv.find_cached_blocks(same)) == 1  # not both: the last token is computed
    assert kv.num_cached_tokens_probe(same) == 4


def test_no_hits_across_salts_for_prompt_logprobs_or_with_caching_off():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    compute(kv, request("a", list(range(9)), cache_salt="alice"), 9)
    assert len(kv.find_cached_blocks(request("b", list(range(9)), cache_salt="alice"))) == 2
    assert kv.find_cached_blocks(request("c", list(range(9)), cache_salt="bob")) == []
    assert kv.find_cached_blocks(request("d", list(range(9)))) == []
    logits = request("e", list(range(9)), cache_salt="alice", needs_prompt_logits=True)
    assert kv.find_cached_blocks(logits) == [] and kv.num_cached_tokens_probe(logits) == 0
    off = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    compute(off, request("a", list(range(9))), 9)
    assert not off.cached and off.find_cached_blocks(request("b", list(range(9)))) == []


def test_a_hash_hit_is_rechecked_token_by_token():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    compute(kv, request("a", [1, 2, 3, 4, 5]), 5)
    other = request("b", [7, 7, 7, 7, 5])
    # A colliding hash: the other prompt's first block hash points at a's block.
    kv.cached[kv.block_hashes(other)[0]] = next(iter(kv.cached.values()))
    assert kv.num_cached_tokens_probe(other) == 4  # the probe trusts hashes ...
    assert kv.find_cached_blocks(other) == []  # ... a lookup does not


def test_freed_blocks_stay_cached_until_evicted_least_recently_used_first():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = request("a", [1, 2, 3, 4, 5])  # blocks [1 2] [3 4] [5 .]
    compute(kv, a, 5)
    head, tail, partial = a.block_ids
    kv.free(a)
    # The unregistered partial block is reused first; the cached tail before the head.
    assert list(kv.free_queue)[:1] == [partial]
    assert list(kv.free_queue).index(tail) < list(kv.free_queue).index(head)
    assert len(kv.find_cached_blocks(request("b", [1, 2, 3, 4, 9]))) == 2
    c = request("c", [8] * 6)
    compute(kv, c, 6)  # three blocks: the two uncached ones, then the cached tail
    assert tail in c.block_ids and head not in c.block_ids
    assert kv.blocks[tail].hash is not None  # re-registered with c's tokens
    assert kv.find_cached_blocks(request("d", [1, 2, 3, 4, 9])) == [head]
    kv.free(c)
    assert_accounting(kv, [])


def test_prefix_lookups_are_counted():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    kv.record_lookup(10, 4)
    kv.record_lookup(6, 0)
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (16, 4)


# ---- swap -----------------------------------------------------------------------------------

def test_swap_out_and_in_move_blocks_between_the_pools():
    kv = KVCacheManager(num_blocks=4, block_size=2, num_swap_blocks=3)
    r = request("r", [1, 2, 3, 4, 5])
    compute(kv, r, 5)
    device = list(r.block_ids)
    mapping = kv.swap_out(r)
    assert [d for d, _ in mapping] == device
    assert r.swap_block_ids == [h for _, h in mapping] and len(set(r.swap_block_ids)) == 3
    assert r.block_ids == [] and kv.num_free_blocks == 4 and kv.free_swap_blocks == []
    assert_accounting(kv, [r])
    back = kv.swap_in(r)
    assert [h for h, _ in back] == [h for _, h in mapping]
    assert r.block_ids == [d for _, d in back] and r.swap_block_ids == []
    assert len(kv.free_swap_blocks) == 3 and kv.num_free_blocks == 1
    assert_accounting(kv, [r])


def test_swap_out_refuses_when_the_host_pool_is_too_small():
    kv = KVCacheManager(num_blocks=4, block_size=2, num_swap_blocks=2)
    r = request("r", [1, 2, 3, 4, 5])
    compute(kv, r, 5)
    blocks = list(r.block_ids)
    assert kv.swap_out(r) is None
    assert r.block_ids == blocks and len(kv.free_swap_blocks) == 2


def test_free_swapped_returns_the_host_blocks():
    kv = KVCacheManager(num_blocks=4, block_size=2, num_swap_blocks=4)
    r = request("r", [1, 2, 3])
    compute(kv, r, 3)
    kv.swap_out(r)
    kv.free_swapped(r)
    assert r.swap_block_ids == [] and sorted(kv.free_swap_blocks) == [0, 1, 2, 3]


# ---- fork and copy-on-write -----------------------------------------------------------------

def forked(block_size: int = 4, prompt_len: int = 6, num_swap_blocks: int = 0):
    """A parent that computed all but its last prompt token, and a child forked there."""
    kv = KVCacheManager(num_blocks=8, block_size=block_size, num_swap_blocks=num_swap_blocks)
    prompt = list(range(1, prompt_len + 1))
    parent, child = request("p", prompt), request("c", prompt)
    compute(kv, parent, prompt_len - 1)
    kv.fork(parent, child)
    child.num_computed_tokens = parent.num_computed_tokens
    return kv, parent, child


def test_fork_shares_the_computed_blocks():
    kv, parent, child = forked()
    assert child.block_ids == parent.block_ids
    assert [kv.blocks[b].ref_cnt for b in parent.block_ids] == [2, 2]
    assert_accounting(kv, [parent, child])


def test_writing_a_shared_partial_block_copies_it_first():
    kv, parent, child = forked()
    shared = list(parent.block_ids)
    assert kv.can_allocate(child, 1) and kv.num_free_blocks == 6
    compute(kv, child, 1)
    assert child.block_ids[0] == shared[0]  # the full block stays shared
    dst = child.block_ids[1]
    assert dst != shared[1] and kv.blocks[shared[1]].ref_cnt == 1
    assert kv.take_pending_copies() == [(shared[1], dst)]
    assert kv.take_pending_copies() == []
    compute(kv, parent, 1)  # the parent now owns its block alone: written in place
    assert parent.block_ids == shared and kv.pending_copies == {}
    assert_accounting(kv, [parent, child])


def test_a_copy_into_a_freed_block_is_dropped():
    kv, parent, child = forked()
    compute(kv, child, 1)
    kv.free(child)
    assert kv.take_pending_copies() == []
    assert_accounting(kv, [parent])


def test_swap_out_reads_a_pending_copy_from_its_source():
    """The copy into the child's new block has not run when the child is swapped out in
    the same step: its host copy must come from the copy's source, and the copy is dropped
    (the swap x copy-on-write bug read the still-empty destination)."""
    kv, parent, child = forked(num_swap_blocks=4)
    source = parent.block_ids[1]
    compute(kv, child, 1)
    mapping = kv.swap_out(child)
    assert [d for d, _ in mapping] == [parent.block_ids[0], source]
    assert kv.take_pending_copies() == []
    assert_accounting(kv, [parent, child])


# ---- random operation sequences -------------------------------------------------------------

SHARED = [11, 12, 13, 14, 15, 16, 17, 18]
operations = st.lists(st.tuples(
    st.sampled_from(["add", "step", "fork", "free", "swap_out", "swap_in", "end_step"]),
    st.integers(0, 5),  # which request (modulo the live ones)
    st.integers(1, 9),  # tokens: prompt length or chunk size
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(block_size=st.integers(1, 4), num_blocks=st.integers(1, 16),
       num_swap_blocks=st.integers(0, 8), enable_prefix_caching=st.booleans(), ops=operations)
def test_random_operations_never_leak_nor_share_a_written_block(
        block_size, num_blocks, num_swap_blocks, enable_prefix_caching, ops):
    """Requests come (with shared prefixes: hits), compute chunks and sampled tokens, fork,
    swap out and in, and go; after every operation the reference counts are the holders,
    the free blocks are the unreferenced ones and the swap pool is partitioned; every block
    a request writes is its own (reference count 1); a copy-on-write destination belongs to
    a live request. Freeing everything leaves every block and host block free."""
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching, num_swap_blocks)
    running: list[Request] = []
    swapped: list[Request] = []
    ids = iter(range(10**6))
    for op, which, tokens in ops:
        if op == "add":
            prompt = SHARED[:tokens // 2] + [100 + next(ids)] * (tokens - tokens // 2)
            r = request(f"r{next(ids)}", prompt)
            hits = kv.find_cached_blocks(r)
            num_new = r.num_tokens - len(hits) * block_size
            if kv.allocate_slots(r, num_new, hits) is not None:
                r.num_computed_tokens = len(hits) * block_size + num_new
                r.append_output_token(7)
                kv.cache_full_blocks(r)
                running.append(r)
        elif op == "step" and running:
            r = running[which % len(running)]
            start = r.num_computed_tokens
            num_new = min(tokens, r.num_tokens - start)
            if kv.allocate_slots(r, num_new) is not None:
                end = start + num_new
                for position in range(start, end):  # the blocks it writes are its own
                    assert kv.blocks[r.block_ids[position // block_size]].ref_cnt == 1
                r.num_computed_tokens = end
                if end == r.num_tokens:
                    r.append_output_token(next(ids) % 50)
                kv.cache_full_blocks(r)
        elif op == "fork" and running:
            parent = running[which % len(running)]
            child = request(f"r{next(ids)}", parent.all_token_ids)
            kv.fork(parent, child)
            child.num_computed_tokens = parent.num_computed_tokens
            running.append(child)
        elif op == "free" and running + swapped:
            r = (running + swapped)[which % len(running + swapped)]
            kv.free(r)
            kv.free_swapped(r)
            (running if r in running else swapped).remove(r)
        elif op == "swap_out" and running:
            r = running[which % len(running)]
            if kv.swap_out(r) is not None:
                running.remove(r)
                swapped.append(r)
        elif op == "swap_in" and swapped:
            r = swapped[which % len(swapped)]
            if len(r.swap_block_ids) <= kv.num_free_blocks:
                kv.swap_in(r)
                swapped.remove(r)
                running.append(r)
        elif op == "end_step":
            kv.take_pending_copies()
        assert_accounting(kv, running + swapped)
        held = {b for r in running for b in r.block_ids}
        assert set(kv.pending_copies) <= held
        for r in running:
            assert len(r.block_ids) * block_size >= r.num_computed_tokens
    for r in running + swapped:
        kv.free(r)
        kv.free_swapped(r)
    assert kv.num_free_blocks == num_blocks and all(m.ref_cnt == 0 for m in kv.blocks)
    assert sorted(kv.free_swap_blocks) == list(range(num_swap_blocks))
    assert kv.take_pending_copies() == []
