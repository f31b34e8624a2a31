"""PrefixCache on its own, over a list of block metadata as the pool keeps it: registration
of full computed blocks, lookups re-checked by token, the probe by hashes, and what an
eviction or a reset leaves of both."""

from __future__ import annotations

from minivllm.core.block_pool import BlockMeta
from minivllm.core.prefix_cache import PrefixCache
from minivllm.core.request import Request

BLOCK = 2


def index(num_blocks: int = 8, enabled: bool = True, keys=lambda r: None) -> PrefixCache:
    return PrefixCache([BlockMeta() for _ in range(num_blocks)], BLOCK, enabled, keys)


def computed(request_id: str, prompt: list[int], block_ids: list[int]) -> Request:
    """A request that holds `block_ids` and computed its whole prompt."""
    r = Request.make(request_id, prompt, max_tokens=4)
    r.block_ids, r.num_computed_tokens = list(block_ids), len(prompt)
    return r


def test_full_blocks_are_registered_once_and_found_by_a_later_request():
    cache = index()
    cache.register_full_blocks(computed("a", [1, 2, 3, 4, 5], [6, 3, 0]))
    assert sorted(cache.cached.values()) == [3, 6]  # the partial third is not registered
    assert cache.blocks[6].tokens == (1, 2) and cache.blocks[3].parent_hash == cache.blocks[6].hash
    later = Request.make("b", [1, 2, 3, 4, 9], max_tokens=4)
    assert cache.find(later) == [6, 3] and cache.probe(later) == 4
    assert cache.num_in_memory(later) == 2
    cache.register_full_blocks(computed("c", [1, 2, 3, 4, 5], [1, 2, 0]))
    assert sorted(cache.cached.values()) == [3, 6]  # the same hashes keep their blocks


def test_a_hit_leaves_one_token_and_prompt_logprobs_or_a_disabled_cache_get_none():
    cache = index()
    cache.register_full_blocks(computed("a", [1, 2, 3, 4], [0, 1]))
    assert cache.find(Request.make("b", [1, 2, 3, 4], max_tokens=4)) == [0]
    logits = Request.make("c", [1, 2, 3, 4, 5], max_tokens=4, needs_prompt_logits=True)
    assert cache.find(logits) == [] and cache.probe(logits) == 0
    off = index(enabled=False)
    off.register_full_blocks(computed("a", [1, 2, 3, 4], [0, 1]))
    assert off.cached == {}


def test_an_eviction_unregisters_the_block_and_later_lookups_see_it():
    cache = index(keys=lambda r: [b"k0", b"k1"])
    cache.register_full_blocks(computed("a", [1, 2, 3, 4, 5], [0, 1, 2]))
    waiting = Request.make("w", [1, 2, 3, 4, 5], max_tokens=4)
    assert cache.find(waiting) == [0, 1] and cache.probe(waiting) == 4
    assert cache.evict(1) == b"k1"
    assert cache.blocks[1].hash is None and cache.num_evictions == 1
    assert cache.find(waiting) == [0] and cache.probe(waiting) == 2


def test_a_reset_forgets_every_block():
    cache = index()
    cache.register_full_blocks(computed("a", [1, 2, 3, 4, 5], [4, 5, 6]))
    waiting = Request.make("w", [1, 2, 3, 4, 5], max_tokens=4)
    assert cache.find(waiting) == [4, 5]
    assert sorted(cache.reset()) == [4, 5]
    assert cache.cached == {} and all(m.hash is None for m in cache.blocks)
    assert cache.find(waiting) == [] and cache.probe(waiting) == 0


def test_a_request_that_lets_go_is_registered_again_from_its_first_block():
    cache = index()
    r = computed("a", [1, 2, 3, 4, 5], [0, 1, 2])
    cache.register_full_blocks(r)
    cache.evict(0)
    cache.register_full_blocks(r)  # remembered: nothing new to register
    assert sorted(cache.cached.values()) == [1]
    cache.forget("a")
    cache.register_full_blocks(r)
    assert sorted(cache.cached.values()) == [0, 1]


def test_lookups_are_counted():
    cache = index()
    cache.record_lookup(10, 4)
    cache.record_lookup(6, 0)
    assert (cache.queries, cache.hits) == (16, 4)
