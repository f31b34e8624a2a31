"""Prefix caching, chunked prefill and parallel sampling: identical greedy outputs, exact
hit rates, LRU eviction, cache-salt isolation and block accounting."""

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minivllm import LLM, SamplingParams
from minivllm.core.kv_cache import KVCacheManager
from minivllm.core.policy import make_policy
from minivllm.core.request import Request, RequestStatus
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.sequence_group import form_group
from tests.conftest import assert_all_blocks_free

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


def _prompts():
    shared = [1] + [(5 * i) % 400 + 50 for i in range(40)]
    return [shared + [(11 * n + i) % 300 + 3 for i in range(n)] for n in (1, 7, 16, 23, 30)]


@pytest.fixture(scope="module")
def baseline(tiny_llama):
    llm = LLM(str(tiny_llama), block_size=8, num_kv_blocks=128, enable_prefix_caching=False,
              enable_chunked_prefill=False)
    return [o.outputs[0].token_ids for o in llm.generate(
        [{"prompt_token_ids": p} for p in _prompts()], GREEDY, use_tqdm=False)]


@pytest.mark.parametrize("prefix, chunked", [(True, False), (False, True), (True, True)])
def test_greedy_identical_with_prefix_caching_and_chunking(tiny_llama, baseline, prefix, chunked):
    # 13-token chunks put chunk boundaries in the middle of 8-token blocks.
    llm = LLM(str(tiny_llama), block_size=8, num_kv_blocks=128, enable_prefix_caching=prefix,
              enable_chunked_prefill=chunked, max_num_batched_tokens=13 if chunked else 2048)
    prompts = [{"prompt_token_ids": p} for p in _prompts()]
    for _ in range(2):  # the second round is served from the prefix cache
        outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outputs] == baseline
    if prefix:
        assert llm.stats().prefix_cache_hit_rate > 0.4
        assert outputs[0].num_cached_tokens > 0
    assert_all_blocks_free(llm)


def test_greedy_identical_with_long_prefill_chunks_capped(tiny_llama, baseline):
    """--long-prefill-token-threshold 5: every prompt in chunks of at most 5 tokens, several
    prompts sharing each 64-token step; the same tokens as one piece."""
    llm = LLM(str(tiny_llama), block_size=8, num_kv_blocks=128, enable_prefix_caching=False,
              max_num_batched_tokens=64, long_prefill_token_threshold=5)
    outputs = llm.generate([{"prompt_token_ids": p} for p in _prompts()], GREEDY,
                           use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == baseline
    assert_all_blocks_free(llm)


def test_greedy_identical_with_partial_prefills_limited(tiny_llama, baseline):
    """--max-num-partial-prefills 2 --max-long-partial-prefills 1 (threshold 6, adaptive):
    prompts held back a step for a seat give the same tokens."""
    llm = LLM(str(tiny_llama), block_size=8, num_kv_blocks=128, enable_prefix_caching=False,
              max_num_batched_tokens=64, long_prefill_token_threshold=6,
              long_prefill_token_threshold_adaptive=True, max_num_partial_prefills=2,
              max_long_partial_prefills=1)
    outputs = llm.generate([{"prompt_token_ids": p} for p in _prompts()], GREEDY,
                           use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == baseline
    assert_all_blocks_free(llm)


def test_parallel_sampling_shares_the_prompt(tiny_llama, baseline):
    llm = LLM(str(tiny_llama), block_size=8, num_kv_blocks=128, enable_prefix_caching=False)
    params = SamplingParams(n=4, temperature=0, max_tokens=10, ignore_eos=True)
    for prompt, expected in zip(_prompts(), baseline):
        output = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
        assert [o.index for o in output.outputs] == [0, 1, 2, 3]
        assert all(o.token_ids == expected for o in output.outputs)
    assert_all_blocks_free(llm)
    sampled = llm.generate({"prompt_token_ids": _prompts()[2]},
                           SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=10),
                           use_tqdm=False)[0]
    assert len({tuple(o.token_ids) for o in sampled.outputs}) > 1  # own generator each
    best = llm.generate({"prompt_token_ids": _prompts()[2]},
                        SamplingParams(n=2, best_of=5, temperature=1.0, seed=3, max_tokens=10),
                        use_tqdm=False)[0]
    assert len(best.outputs) == 2
    assert best.outputs[0].cumulative_logprob >= best.outputs[1].cumulative_logprob
    assert_all_blocks_free(llm)


def test_system_prompt_hit_rate_is_the_expected_fraction(tiny_llama):
    llm = LLM(str(tiny_llama), block_size=16, num_kv_blocks=256)
    system = [1] + [(3 * i) % 400 + 20 for i in range(199)]  # 200 tokens
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    for user in range(5):
        suffix = [(user * 37 + i) % 300 + 100 for i in range(20)]
        llm.generate({"prompt_token_ids": system + suffix}, params, use_tqdm=False)
    stats = llm.stats()
    # The first request computes everything; each later one reuses the 12 full blocks
    # (192 tokens) that hold only system-prompt tokens.
    assert stats.prefix_cache_queries == 5 * 220
    assert stats.prefix_cache_hits == 4 * 192
    assert stats.prefix_cache_hit_rate == pytest.approx(4 * 192 / (5 * 220))
    assert_all_blocks_free(llm)


def _request(rid, tokens, salt=None):
    return Request.make(rid, tokens, max_tokens=4, arrival_time=0.0, cache_salt=salt)


def _compute(kv, request):
    """Pretend the model computed the whole prompt of an admitted request."""
    cached = kv.find_cached_blocks(request)
    assert kv.allocate_slots(request, request.num_tokens - len(cached) * kv.block_size, cached) \
        is not None
    request.num_computed_tokens = request.num_tokens
    kv.cache_full_blocks(request)
    return len(cached)


def test_lru_eviction_frees_tails_first_and_oldest_first():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a, b = _request("a", [1, 2, 3, 4, 9]), _request("b", [5, 6, 7, 8, 9])
    _compute(kv, a)  # blocks: [1 2] [3 4] [9]
    kv.free(a)
    _compute(kv, b)  # reuses a's unhashed tail block first, then evicts a's tail [3 4]
    kv.free(b)
    assert _compute(kv, _request("a2", [1, 2, 3, 4, 9])) == 1  # only a's head survived
    kv.free_swapped(a)


def test_cache_salt_isolates_tenants():
    kv = KVCacheManager(num_blocks=16, block_size=2)
    tokens = [1, 2, 3, 4, 5, 6, 7]
    first = _request("t1", tokens, salt="tenant-1")
    _compute(kv, first)
    assert _compute(kv, _request("t2", tokens, salt="tenant-2")) == 0
    assert _compute(kv, _request("t1b", tokens, salt="tenant-1")) == 3


def test_hash_collision_never_serves_wrong_kv():
    kv = KVCacheManager(num_blocks=8, block_size=2)
    request = _request("a", [1, 2, 3])
    _compute(kv, request)
    block = request.block_ids[0]
    # Forge a collision: the cache maps the other prompt's hash to a's first block.
    other = _request("b", [7, 8, 3])
    forged = kv.block_hashes(other)[0]
    kv.cached[forged] = block
    assert kv.find_cached_blocks(other) == []


def test_decodes_continue_every_step_while_a_long_prompt_is_chunked():
    config = SchedulerConfig(num_blocks=64, block_size=4, max_num_batched_tokens=8)
    scheduler = Scheduler(config, make_policy("fcfs"), clock=lambda: 0.0)
    short = _request("short", [1, 2, 3])
    short.max_tokens = 20
    scheduler.add_request(short)
    scheduler.update_from_output(scheduler.schedule(), {"short": 9})
    scheduler.add_request(_request("long", list(range(1, 60))))
    chunks = 0
    while scheduler.requests["long"].num_computed_tokens < 59:
        out = scheduler.schedule()
        assert out.num_scheduled_tokens["short"] == 1  # the decode runs in every step
        assert out.total_num_scheduled_tokens <= 8
        chunks += 1
        scheduler.update_from_output(out, {"short": 9})
    assert chunks >= 59 // 7


@settings(max_examples=40, deadline=None)
# A head whose prompt is all cached but its last token, admitted when memory is short.
@example([(19, 1, 1, False), (1, 1, 1, False), (13, 1, 2, False)], 11, 2)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(1, 6), st.integers(1, 3),
                          st.booleans()), min_size=1, max_size=10),
       st.integers(4, 40), st.sampled_from([2, 4]))
def test_block_accounting_over_random_mixes(specs, num_blocks, block_size):
    """Shared prefixes, n > 1 and aborts: every block is freed exactly once."""
    config = SchedulerConfig(num_blocks=num_blocks, block_size=block_size,
                             max_num_batched_tokens=16, max_model_len=64)
    scheduler = Scheduler(config, make_policy("fcfs"), clock=lambda: 0.0)
    live = []
    for i, (prompt_len, max_tokens, n, abort) in enumerate(specs):
        prompt = [1 + (j % 5) for j in range(prompt_len)]  # heavily shared prefixes
        if (prompt_len + max_tokens) > num_blocks * block_size:
            continue
        sequences = [Request.make(f"r{i}", prompt, max_tokens, arrival_time=float(i))]
        sequences += [Request.make(f"r{i}#{k}", prompt, max_tokens, arrival_time=float(i))
                      for k in range(1, n)]
        head = form_group(sequences)
        scheduler.add_request(head)
        live.append((head, abort))
    for _ in range(500):
        if not scheduler.has_unfinished_requests():
            break
        out = scheduler.schedule()
        sampled = {rid: 7 for rid, n in out.num_scheduled_tokens.items()
                   if scheduler.requests[rid].num_computed_tokens + n
                   == scheduler.requests[rid].num_tokens}
        for request in scheduler.update_from_output(out, sampled):
            if request.num_output_tokens >= request.max_tokens:
                scheduler.finish_request(request, RequestStatus.FINISHED_LENGTH)
        for head, abort in live:
            if abort and head.num_output_tokens == 1:
                for member in head.group.sequences:
                    scheduler.finish_request(member, RequestStatus.FINISHED_ABORTED)
        assert all(meta.ref_cnt >= 0 for meta in scheduler.kv.blocks)
    assert not scheduler.has_unfinished_requests()
    assert scheduler.kv.num_free_blocks == num_blocks
    for head, _ in live:
        for member in head.group.sequences:
            assert member.is_finished
            assert member.num_output_tokens <= member.max_tokens
