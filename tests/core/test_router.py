"""The data-parallel router's policies (core/router.py), without engines."""

from __future__ import annotations

import pytest

from minivllm.core.kv_cache import KVCacheManager
from minivllm.core.request import Request
from minivllm.core.router import ROUTER_POLICIES, make_router

BLOCK = 4


def prompt(system: int, user: int, blocks: int = 4) -> list[int]:
    """`blocks` blocks shared by every prompt of `system`, then one block of the user's."""
    return [1000 * system + i for i in range(blocks * BLOCK)] + [7] * BLOCK + [user]


def test_registry_and_bad_names():
    assert set(ROUTER_POLICIES) == {"round_robin", "least_load", "cache_aware"}
    with pytest.raises(ValueError, match="unknown router policy 'nope'.*cache_aware"):
        make_router("nope", 2, BLOCK)
    with pytest.raises(ValueError, match="at least one replica"):
        make_router("round_robin", 0, BLOCK)


def test_round_robin_takes_turns_and_skips_a_dead_replica():
    router = make_router("round_robin", 3, BLOCK)
    assert [router.route([1, 2, 3]).replica for _ in range(4)] == [0, 1, 2, 0]
    router.set_available(2, False)
    assert [router.route([1]).replica for _ in range(4)] == [1, 0, 1, 0]
    router.set_available(0, False)
    router.set_available(1, False)
    with pytest.raises(RuntimeError, match="no engine replica"):
        router.route([1])


def test_least_load_reads_the_reports_and_counts_what_was_routed_since():
    router = make_router("least_load", 3, BLOCK)
    router.update_stats(0, num_running=4, num_waiting=2, kv_cache_usage=0.5)
    router.update_stats(1, num_running=1, num_waiting=0, kv_cache_usage=0.9)
    router.update_stats(2, num_running=1, num_waiting=0, kv_cache_usage=0.1)
    # 2 ties 1 on requests and wins on KV usage; then each routed request counts until the
    # next report, so the next ones spread rather than pile on one replica.
    assert [router.route([5]).replica for _ in range(3)] == [2, 1, 2]
    router.update_stats(2, num_running=9, num_waiting=9, kv_cache_usage=1.0)
    assert router.route([5]).replica == 1


def test_cache_aware_follows_the_longest_prefix():
    router = make_router("cache_aware", 4, BLOCK)
    first = [router.route(prompt(s, 0)).replica for s in range(4)]
    assert sorted(first) == [0, 1, 2, 3]  # nothing cached: least loaded, one each
    for s in range(4):
        router.update_stats(first[s], 1, 0, 0.1)
    for user in range(1, 6):
        for s in range(4):
            decision = router.route(prompt(s, user))
            assert decision.replica == first[s]
            assert decision.prefix_hit_blocks == 5  # the system blocks and the [7] block
            assert decision.prefix_hit_tokens == 5 * BLOCK
        for s in range(4):
            router.update_stats(first[s], 1, 0, 0.1)


def test_cache_aware_leaves_a_replica_loaded_beyond_the_threshold():
    router = make_router("cache_aware", 2, BLOCK, balance_threshold=3)
    assert router.route(prompt(0, 0)).replica == 0
    router.update_stats(0, num_running=3, num_waiting=0, kv_cache_usage=0.5)  # 3 - 0 <= 3
    assert router.route(prompt(0, 1)).replica == 0
    router.update_stats(0, num_running=3, num_waiting=1, kv_cache_usage=0.5)  # 4 - 0 > 3
    decision = router.route(prompt(0, 2))
    assert decision.replica == 1 and decision.prefix_hit_blocks == 0
    # Now both hold the prefix: the less loaded one wins the tie.
    router.update_stats(1, num_running=1, num_waiting=0, kv_cache_usage=0.1)
    assert router.route(prompt(0, 3)).replica == 1


def test_a_replica_back_from_the_dead_has_an_empty_cache():
    router = make_router("cache_aware", 2, BLOCK)
    assert router.route(prompt(0, 0)).replica == 0
    router.set_available(0, False)
    assert router.route(prompt(0, 1)).replica == 1
    router.set_available(0, True)
    router.update_stats(1, num_running=1, num_waiting=0, kv_cache_usage=0.1)
    assert router.prefixes[0].match(router_hashes(prompt(0, 1))) == 0
    assert router.route(prompt(0, 2)).replica == 1  # replica 1 holds it now


def test_the_prefix_index_forgets_beyond_its_capacity():
    router = make_router("cache_aware", 1, BLOCK, cache_capacity_blocks=6)
    router.route(prompt(0, 0))  # 6 full blocks: all remembered
    assert router.route(prompt(0, 1)).prefix_hit_blocks == 5
    router.route(prompt(1, 0))  # 6 other blocks evict the least recently used
    assert router.route(prompt(0, 2)).prefix_hit_blocks == 0


def test_sticky_sessions_keep_a_user_on_its_replica_within_the_threshold():
    router = make_router("least_load", 2, BLOCK, sticky_sessions=True, balance_threshold=2)
    assert router.route([1], user="alice").replica == 0
    assert router.route([1], user="bob").replica == 1
    assert [router.route([1], user="alice").replica for _ in range(2)] == [0, 0]
    router.update_stats(0, num_running=5, num_waiting=0, kv_cache_usage=0.0)
    router.update_stats(1, num_running=0, num_waiting=0, kv_cache_usage=0.0)
    assert router.route([1], user="alice").replica == 1  # 0 is 5 ahead: the session moves
    assert router.route([1], user="alice").replica == 1
    plain = make_router("least_load", 2, BLOCK)
    assert [plain.route([1], user="alice").replica for _ in range(2)] == [0, 1]


def router_hashes(token_ids: list[int]) -> list[int]:
    from minivllm.core.prefix_cache import extend_block_hashes

    return extend_block_hashes([], token_ids, BLOCK)


def test_the_router_hashes_blocks_as_the_kv_manager_does():
    tokens = prompt(3, 9)
    kv = KVCacheManager(num_blocks=8, block_size=BLOCK)
    for salt in (None, "tenant"):
        request = Request.make("r", tokens, 4, 0.0, cache_salt=salt)
        router = make_router("cache_aware", 1, BLOCK)
        router.route(tokens, cache_salt=salt)
        assert router.prefixes[0].match(kv.block_hashes(request)) == len(tokens) // BLOCK
    router = make_router("cache_aware", 1, BLOCK)
    router.route(tokens, cache_salt="a")
    assert router.route(tokens, cache_salt="b").prefix_hit_blocks == 0  # salts never share
