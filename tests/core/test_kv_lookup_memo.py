"""The KV manager's remembered lookups (kept while no eviction, nor a hit block moving into or
out of the free queue, happened since): a waiting request's prefix hits and the blocks its
admission takes, asked again at every step, equal those from scratch after any mix of
registrations, hits taken, frees and evictions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.core.kv_cache import KVCacheManager
from minivllm.core.request import Request

SHARED = list(range(1, 41))


def request(request_id: str, prompt: list[int]) -> Request:
    return Request.make(request_id, prompt, max_tokens=8)


def from_scratch(kv: KVCacheManager, r: Request) -> tuple[int, list[int], int]:
    """The probe's tokens by walking the hashes, find_cached_blocks of a request with the
    same tokens that was never looked up, and the blocks one more token takes with those
    hits (its own block and the hits in the free queue)."""
    hashes, limit, num = kv.block_hashes(r), (r.num_tokens - 1) // kv.block_size, 0
    while num < limit and hashes[num] in kv.cached:
        num += 1
    fresh = request(f"fresh-{r.request_id}", r.all_token_ids)
    hits = kv.find_cached_blocks(fresh)
    kv.free(fresh)  # it holds no block: this only forgets its lookup
    return num * kv.block_size, hits, 1 + sum(kv.blocks[b].ref_cnt == 0 for b in hits)


operations = st.lists(st.tuples(
    st.sampled_from(["add", "free", "look"]),
    st.integers(0, 5),  # which request (modulo the live or waiting ones)
    st.integers(1, 40),  # prompt length
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(block_size=st.integers(1, 4), num_blocks=st.integers(2, 24), ops=operations)
def test_remembered_lookups_equal_lookups_from_scratch(block_size, num_blocks, ops):
    kv = KVCacheManager(num_blocks, block_size)
    running: list[Request] = []
    waiting = [request(f"w{n}", SHARED[:n] + [900 + n]) for n in (3, 9, 17, 26, 40)]
    ids = iter(range(10**6))
    for op, which, length in ops:
        if op == "add":  # computes its whole prompt: registers blocks, may evict others
            r = request(f"r{next(ids)}", SHARED[:length // 2] + [100 + next(ids)] * length)
            hits = kv.find_cached_blocks(r)
            num_new = r.num_tokens - len(hits) * block_size
            if kv.allocate_slots(r, num_new, hits) is not None:
                r.num_computed_tokens = r.num_tokens
                kv.cache_full_blocks(r)
                running.append(r)
        elif op == "free" and running:
            kv.free(running.pop(which % len(running)))
        for r in waiting if op == "look" else waiting[which % len(waiting):][:1]:
            probe, hits, takes = from_scratch(kv, r)
            assert kv.num_cached_tokens_probe(r) == probe
            assert kv.find_cached_blocks(r) == hits
            short = takes - kv.num_free_blocks - 1  # free blocks short of one more token
            assert kv.can_allocate(r, 1, hits, extra_free=short + 1)
            assert not kv.can_allocate(r, 1, hits, extra_free=short)
