"""The cache-aware policies: `lpm` (longest prefix match first, with its starvation guard)
and `residual_sjf` (shortest residual prefill first: prompt tokens less the cached ones, in
blocks; recovery first; max-wait aging)."""

from __future__ import annotations

import pytest

from minivllm.core.policy import PolicyConfig
from tests.core.test_scheduler_policies import Sim

SHARED = list(range(1000, 1016))  # 16 tokens: four full blocks of 4


def warm(policy: str, **options) -> Sim:
    """A Sim whose prefix cache holds SHARED (a finished request's prompt); one seat, so
    queued requests start one at a time in the policy's order."""
    sim = Sim(policy, max_num_seqs=1, policy_options=options)
    sim.add("warm", prompt=SHARED + [1], max_tokens=1)
    sim.run()
    return sim


def first_admitted(sim: Sim, *request_ids: str) -> str:
    sim.run()
    return next(rid for rid in sim.admitted if rid in request_ids)


@pytest.mark.parametrize("policy,expected", [("lpm", "shares"), ("fcfs", "cold")])
def test_lpm_starts_the_request_whose_prefix_is_cached_first(policy, expected):
    sim = warm(policy)
    sim.add("cold", prompt=list(range(2000, 2017)), max_tokens=2)  # arrived first
    sim.add("shares", prompt=SHARED + [7, 8, 9], max_tokens=2)
    assert first_admitted(sim, "cold", "shares") == expected
    sim.assert_all_free()


def test_lpm_serves_a_request_queued_past_the_aging_time_first():
    sim = Sim("lpm", max_num_seqs=1, aging_s=2.0)
    sim.add("warm", prompt=SHARED + [1], max_tokens=1)
    sim.run()  # as warm() does, with aging_s 2 s
    sim.add("busy", prompt=list(range(3000, 3005)), max_tokens=6)  # holds the one seat
    sim.step()
    sim.add("cold", prompt=list(range(2000, 2017)), max_tokens=2)
    sim.clock.now += 3.0  # cold has waited past aging_s when shares arrives
    sim.add("shares", prompt=SHARED + [7, 8, 9], max_tokens=2)
    assert first_admitted(sim, "cold", "shares") == "cold"
    sim.assert_all_free()


@pytest.mark.parametrize("policy,expected", [("residual_sjf", "warm_long"),
                                             ("fcfs", "cold_short")])
def test_residual_sjf_counts_a_cache_warm_long_prompt_as_short(policy, expected):
    """warm_long: 20 prompt tokens, 16 cached (1 block left); cold_short: 9 (3 blocks)."""
    sim = warm(policy)
    sim.add("cold_short", prompt=list(range(2000, 2009)), max_tokens=2)
    sim.add("warm_long", prompt=SHARED + [7, 8, 9, 10], max_tokens=2)
    assert first_admitted(sim, "cold_short", "warm_long") == expected
    sim.assert_all_free()


def test_residual_sjf_max_wait_zero_is_fcfs_and_ages_otherwise():
    fcfs = warm("residual_sjf", residual_sjf_max_wait_ms=0)
    fcfs.add("cold_short", prompt=list(range(2000, 2009)), max_tokens=2)
    fcfs.add("warm_long", prompt=SHARED + [7, 8, 9, 10], max_tokens=2)
    assert first_admitted(fcfs, "cold_short", "warm_long") == "cold_short"
    aged = warm("residual_sjf", residual_sjf_max_wait_ms=2000)
    aged.add("busy", prompt=list(range(3000, 3005)), max_tokens=6)
    aged.step()
    aged.add("cold_short", prompt=list(range(2000, 2009)), max_tokens=2)
    aged.clock.now += 3.0
    aged.add("warm_long", prompt=SHARED + [7, 8, 9, 10], max_tokens=2)
    assert first_admitted(aged, "cold_short", "warm_long") == "cold_short"


def test_residual_sjf_resumes_preempted_requests_first():
    sim = Sim("residual_sjf", num_blocks=12, block_size=4, preemption_mode="recompute",
              enable_prefix_caching=False,  # the victim recomputes all its tokens
              policy_options={"residual_sjf_max_wait_ms": 1e9})  # no aging
    sim.add("long", prompt_len=20, max_tokens=20)
    sim.add("short", prompt_len=4, max_tokens=20)
    sim.run(until=lambda: sim.preemptions)
    victim = sim.preemptions[0][1]
    sim.add("newcomer", prompt_len=4, max_tokens=2)
    order = sim.scheduler.policy.order(sim.scheduler.waiting, sim.clock.now)
    assert order[0].request_id == victim
    sim.run()
    sim.assert_all_free()


def test_bad_residual_sjf_max_wait_is_named():
    with pytest.raises(ValueError, match="residual_sjf_max_wait_ms"):
        PolicyConfig(residual_sjf_max_wait_ms=-1)
