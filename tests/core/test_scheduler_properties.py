"""Property tests of the scheduler over random traffic: random arrivals, prompt lengths
(sharing prefixes), max_tokens, priorities and aborts, for every policy and preemption mode,
with small block and swap pools. Driven by the fake-model `Sim`, whose `check` asserts the
budgets, the queues and the block accounting (reference counts are the holders, so never
negative; free blocks are the unreferenced ones; the swap pool is partitioned) at every
step, and whose fake KV contents catch a request reading slots that are not its own."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from minivllm.core.policy import POLICIES
from minivllm.core.preemption import VICTIM_RULES
from minivllm.core.request import RequestStatus
from tests.core.test_scheduler_policies import Sim

SHARED_PREFIX = list(range(1, 40))

arrivals = st.lists(st.tuples(
    st.integers(0, 20),  # arrival step
    st.integers(1, 14),  # prompt length
    st.integers(0, 14),  # how much of the prompt is SHARED_PREFIX
    st.integers(1, 10),  # max_tokens
    st.integers(0, 3),  # priority
), min_size=1, max_size=12)

configs = st.fixed_dictionaries({
    "policy": st.sampled_from(sorted(POLICIES)),
    "aging_s": st.sampled_from([0.5, 10.0, 1e9]),
    "block_size": st.sampled_from([1, 2, 4]),
    "num_blocks": st.integers(2, 12),
    "num_swap_blocks": st.integers(0, 12),
    "max_num_seqs": st.integers(1, 4),
    "max_num_batched_tokens": st.integers(1, 24),
    "enable_chunked_prefill": st.booleans(),
    "enable_prefix_caching": st.booleans(),
    "preemption_mode": st.sampled_from([None, "recompute", "swap"]),
    "active_preemption": st.booleans(),
    "min_run_quantum": st.integers(0, 3),
    "preemption_victim": st.sampled_from(sorted(VICTIM_RULES)),
    # Read by the policies that take them (edf's deadlines on the fake clock's seconds).
    "policy_options": st.fixed_dictionaries({
        "ttft_slo_ms": st.sampled_from([None, 3000.0, 20000.0]),
        "e2e_slo_ms": st.sampled_from([None, 15000.0]),
        "edf_action": st.sampled_from(["shed", "deprioritize"]),
        "vtc_weights": st.sampled_from(["1,2", "1,1"]),
        "mlfq_base_quantum": st.integers(1, 4),
    }),
})


@settings(max_examples=250, deadline=None)
@given(config=configs, arrivals=arrivals,
       aborts=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 11)), max_size=4))
def test_random_traffic_loses_nothing_and_leaks_nothing(config, arrivals, aborts):
    sim = Sim(**config)
    capacity = config["num_blocks"] * config["block_size"]
    if not config["enable_chunked_prefill"]:  # a sequence must fit one step
        capacity = min(capacity, config["max_num_batched_tokens"])
    accepted, aborted = [], set()
    last_event = max(step for step, *_ in arrivals + aborts)
    for step in range(last_event + 1000):
        for i, (when, prompt_len, shared, max_tokens, priority) in enumerate(arrivals):
            if when == step:
                prompt = SHARED_PREFIX[:min(shared, prompt_len)]
                prompt += [100 + i] * (prompt_len - len(prompt))
                try:
                    request = sim.add(f"r{i}", max_tokens=max_tokens, priority=priority,
                                      prompt=prompt, user=f"tenant{priority % 2}")
                except ValueError:  # rejected up front: it could never run
                    assert prompt_len + max_tokens > capacity
                else:
                    assert prompt_len + max_tokens <= capacity
                    accepted.append(request)
        for when, index in aborts:
            if when == step and index < len(accepted) and not accepted[index].is_finished:
                sim.abort(accepted[index].request_id)
                aborted.add(accepted[index].request_id)
        if step > last_event and not sim.scheduler.has_unfinished_requests():
            break
        sim.step()
    assert not sim.scheduler.has_unfinished_requests(), "a request never finished"
    shed = {r.request_id for r in sim.scheduler.deadlines.take_shed()}
    assert len(shed) == sim.scheduler.stats().num_requests_shed
    for request in accepted:
        if request.request_id in aborted | shed:
            assert request.status is RequestStatus.FINISHED_ABORTED
            assert request.num_output_tokens <= request.max_tokens
        else:
            assert request.status is RequestStatus.FINISHED_LENGTH
            assert request.num_output_tokens == request.max_tokens
    sim.assert_all_free()


# Shapes on which swap-out reading a copy-on-write copy's destination (before the copy is
# made) hands a sibling garbage KV: random draws find that bug under a few seeds only, these
# find it every run. Found by re-injecting it into KVCacheManager.swap_out.
SWAP_X_COPY_ON_WRITE = [
    ("priority", 2, 10, False, True, None,
     [(0, 1, 1, 1, 0)] * 4 + [(0, 1, 1, 4, 0), (0, 1, 2, 4, 0), (2, 2, 4, 1, 1), (3, 1, 3, 1, 0)]),
    ("hrrn", 4, 8, False, True, None, [(0, 1, 4, 2, 0), (1, 9, 1, 3, 0), (1, 10, 2, 2, 0)]),
    ("sjf", 2, 8, False, True, None,
     [(0, 1, 2, 4, 0), (2, 2, 4, 2, 0), (3, 1, 1, 1, 0), (3, 1, 1, 1, 0)]),
    ("edf", 3, 12, False, True, None,
     [(0, 1, 1, 1, 0), (0, 4, 1, 1, 0), (0, 13, 4, 7, 0), (0, 17, 2, 1, 0)]),
    ("priority", 2, 8, False, True, "swap", [(0, 1, 1, 5, 0), (3, 2, 3, 1, 1), (4, 1, 6, 1, 0)]),
    ("hrrn", 2, 8, True, True, None,
     [(0, 1, 1, 1, 0)] * 2 + [(0, 1, 1, 2, 0), (0, 1, 6, 2, 0), (0, 2, 3, 1, 0)]),
]


def pin_examples(shapes):
    def decorate(test):
        for (policy, block_size, num_blocks, enable_prefix_caching, active_preemption,
             preemption_mode, groups) in reversed(shapes):
            test = example(policy=policy, block_size=block_size, num_blocks=num_blocks,
                           enable_prefix_caching=enable_prefix_caching,
                           active_preemption=active_preemption,
                           preemption_mode=preemption_mode, sample_seed=0, groups=groups)(test)
        return test
    return decorate


@settings(max_examples=300, deadline=None)
@given(policy=st.sampled_from(sorted(POLICIES)),
       block_size=st.integers(2, 8), num_blocks=st.integers(8, 40),
       enable_prefix_caching=st.booleans(), active_preemption=st.booleans(),
       preemption_mode=st.sampled_from([None, "swap", "recompute"]),
       sample_seed=st.integers(0, 2**16),
       groups=st.lists(st.tuples(st.integers(0, 8),  # arrival step
                                 st.integers(1, 20),  # prompt length
                                 st.integers(1, 6),  # n
                                 st.integers(1, 12),  # max_tokens
                                 st.integers(0, 3)),  # priority
                       min_size=1, max_size=8))
@pin_examples(SWAP_X_COPY_ON_WRITE)
def test_parallel_sampling_reads_only_its_own_kv(policy, block_size, num_blocks,
                                                 enable_prefix_caching, active_preemption,
                                                 preemption_mode, sample_seed, groups):
    """n > 1 with sampled siblings (each writes its own KV after the shared prompt) under
    memory pressure: copy-on-write copies, swaps and recomputes in the same steps. The fake
    KV store applies every mapping in the runner's order and fails a request that reads a
    slot holding anything but its own history — a missing or misordered copy included."""
    sim = Sim(policy, sample_seed=sample_seed, block_size=block_size, num_blocks=num_blocks,
              num_swap_blocks=num_blocks, max_num_seqs=8, max_num_batched_tokens=32,
              enable_prefix_caching=enable_prefix_caching, preemption_mode=preemption_mode,
              active_preemption=active_preemption, min_run_quantum=1)
    capacity = num_blocks * block_size
    last_arrival = max(g[0] for g in groups)
    for step in range(last_arrival + 2000):
        for i, (when, prompt_len, n, max_tokens, priority) in enumerate(groups):
            # Every sibling must fit the cache alone; shared prefixes make prefix hits.
            if when == step and prompt_len + max_tokens <= capacity:
                prompt = SHARED_PREFIX[:prompt_len // 2] + [200 + i] * (prompt_len - prompt_len // 2)
                sim.add(f"g{i}", prompt=prompt, max_tokens=max_tokens, priority=priority, n=n)
        if step > last_arrival and not sim.scheduler.has_unfinished_requests():
            break
        sim.step()
    assert not sim.scheduler.has_unfinished_requests(), "a request never finished"
    assert all(r.num_output_tokens == r.max_tokens for r in sim.requests.values())
    sim.assert_all_free()
