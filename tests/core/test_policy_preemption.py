"""Preemption's pluggable parts on the fake clock: active preemption when the batch is full by
max_num_seqs (KV blocks to spare), a preempted request keeping its place, the victim rules,
and the recompute tax."""

from __future__ import annotations

import pytest

from minivllm.core.preemption import VICTIM_RULES, victim_rule
from minivllm.core.request import RequestStatus
from tests.core.test_scheduler_policies import Sim


def test_a_full_batch_is_preempted_for_a_better_ranked_request_with_blocks_to_spare():
    sim = Sim("priority", aging_s=1e9, num_blocks=64, max_num_seqs=2, active_preemption=True,
              min_run_quantum=2, preemption_mode="recompute")
    sim.add("low1", max_tokens=20, priority=5)
    sim.add("low2", max_tokens=20, priority=6)
    sim.step()
    high = sim.add("high", max_tokens=2, priority=0)
    sim.run(until=lambda: high.first_scheduled_step is not None)
    assert sim.kv.num_free_blocks > 32  # KV blocks were never short: the seats were
    assert [p[1] for p in sim.preemptions] == ["low2"]  # the worse of the two
    assert high.first_scheduled_step == 1 + 2  # as soon as the run quantum is over
    sim.run()
    sim.assert_all_free()


@pytest.mark.parametrize("policy", ["fcfs", "priority", "sjf", "hrrn", "vtc", "edf"])
def test_a_preempted_request_keeps_its_place_ahead_of_later_arrivals(policy):
    """A request is preempted for lack of KV blocks; `later`, arriving after it with the same
    shape, must not be admitted before it comes back. (mlfq ranks by level, not arrival: a
    preempted request keeps its level, tests/core/test_policy_mlfq.py.)"""
    sim = Sim(policy, num_blocks=6, block_size=4, max_num_seqs=2, preemption_mode="recompute")
    sim.add("first", prompt_len=8, max_tokens=12)
    sim.clock.now += 1.0
    sim.add("second", prompt_len=8, max_tokens=12)
    sim.clock.now += 1.0
    sim.run(until=lambda: sim.preemptions)
    victim = sim.requests[sim.preemptions[0][1]]
    sim.clock.now += 1.0
    sim.add("later", prompt_len=8, max_tokens=12)
    sim.run()
    # The victim is scheduled again before `later` is first (or ahead of it in one step).
    order = [(out.step, i, rid) for out in sim.outputs if out.step > sim.preemptions[0][0]
             for i, rid in enumerate(out.num_scheduled_tokens)]
    assert min(o for o in order if o[2] == victim.request_id) < min(
        o for o in order if o[2] == "later")
    sim.assert_all_free()


def crowded(rule: str) -> Sim:
    """a (12 tokens, priority 2), b (4, priority 0), c (8, priority 1), arriving in that
    order, fill all 6 blocks; b decodes first and needs a seventh block."""
    sim = Sim("priority", num_blocks=6, block_size=4, preemption_victim=rule,
              preemption_mode="recompute")
    for request_id, prompt_len, priority in [("a", 12, 2), ("b", 4, 0), ("c", 8, 1)]:
        sim.add(request_id, prompt_len=prompt_len, max_tokens=6, priority=priority)
        sim.clock.now += 1.0
    assert not sim.step().preempted_req_ids
    return sim


@pytest.mark.parametrize("rule, victim", [
    ("lowest_rank", "a"),  # the policy's worst: priority 2
    ("latest_arrival", "c"),
    ("least_work_done", "b"),  # 4 computed tokens, the fewest: the least to recompute
])
def test_victim_rules(rule, victim):
    sim = crowded(rule)
    assert sim.step().preempted_req_ids[0] == victim
    sim.run()
    sim.assert_all_free()


def test_unknown_victim_rule_names_the_known_ones():
    with pytest.raises(ValueError, match="lowest_rank, latest_arrival, least_work_done"):
        victim_rule("random")
    assert set(VICTIM_RULES) == {"lowest_rank", "latest_arrival", "least_work_done"}


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_recompute_tax_counts_tokens_computed_again(prefix_caching):
    sim = Sim("priority", num_blocks=6, block_size=4, preemption_mode="recompute",
              enable_prefix_caching=prefix_caching)
    for request_id, prompt_len, priority in [("a", 12, 2), ("b", 4, 0), ("c", 8, 1)]:
        sim.add(request_id, prompt_len=prompt_len, max_tokens=6, priority=priority)
    sim.step()
    assert sim.step().preempted_req_ids == ["a"]  # its 12 computed tokens are dropped
    sim.run()
    tax = sim.scheduler.recompute_tax
    total = sum(o.total_num_scheduled_tokens for o in sim.outputs)
    assert tax.num_computed_tokens_total == total
    # Computed once, each request's tokens are its prompt and outputs but the last sampled
    # (fresh prompts: no prefix hits); whatever was computed beyond that was computed again.
    once = sum(r.num_prompt_tokens + r.max_tokens - 1 for r in sim.requests.values())
    assert tax.num_recomputed_tokens == total - once
    # a and c are both recomputed (12 + 12 tokens); with prefix caching, the full blocks
    # they freed are hits when they come back, and hits are not computed.
    assert tax.num_recomputed_tokens == (12 if prefix_caching else 24)
    assert tax.share == tax.num_recomputed_tokens / total
    assert sim.requests["a"].status is RequestStatus.FINISHED_LENGTH
    sim.assert_all_free()


def test_least_work_done_pays_less_recompute_tax_than_latest_arrival():
    def tax(rule: str) -> int:
        sim = Sim("fcfs", num_blocks=10, block_size=2, preemption_mode="recompute",
                  enable_prefix_caching=False, preemption_victim=rule)
        for i, prompt_len in enumerate([2, 10, 4, 2]):
            sim.add(f"r{i}", prompt_len=prompt_len, max_tokens=8)
            sim.clock.now += 1.0
        sim.run()
        sim.assert_all_free()
        return sim.scheduler.recompute_tax.num_recomputed_tokens

    assert tax("least_work_done") < tax("latest_arrival")
