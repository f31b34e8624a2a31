"""mlfq on the fake clock: skip-join levels, quanta doubling with demotion, preemption across
levels only, a preempted request keeping its level, and aging that keeps it starvation-free."""

from __future__ import annotations

from minivllm.core.policy import make_policy
from minivllm.core.request import Request
from tests.core.test_scheduler_policies import Sim, run_with_stream


def test_skip_join_enters_the_level_whose_quantum_covers_the_prefill():
    policy = make_policy("mlfq", mlfq_base_quantum=2)
    policy.token_budget = 16  # a prefill of P tokens takes ceil(P / 16) iterations
    levels = {p: policy.level(Request.make(str(p), [1] * p, 4, 0.0))
              for p in (4, 16, 40, 100, 10**5)}
    # quanta 2, 4, 8, ...: 1 and 1 iterations -> 0; 3 -> 1 (4); 7 -> 2 (8); 6250 -> 12 levels' last
    assert levels == {4: 0, 16: 0, 40: 1, 100: 2, 10**5: 11}


def test_demotion_each_time_a_levels_quantum_is_used_up():
    sim = Sim("mlfq", aging_s=1e9, policy_options={"mlfq_base_quantum": 2},
              max_num_batched_tokens=16)
    request = sim.add("r", prompt_len=4, max_tokens=20)
    policy = sim.scheduler.policy
    levels = []
    while request.num_output_tokens < 20:
        sim.step()
        levels.append(policy.level(request))
    # service = 1 prefill iteration + outputs: 2 iterations at level 0, 4 at 1, 8 at 2, ...
    assert levels[:3] == [0, 1, 1] and levels.count(1) == 4 and levels.count(2) == 8
    assert levels[-1] == 3


def test_preemption_across_levels_only_and_a_preempted_request_keeps_its_level():
    sim = Sim("mlfq", aging_s=1e9, policy_options={"mlfq_base_quantum": 2}, max_num_seqs=1,
              active_preemption=True, min_run_quantum=1, preemption_mode="recompute")
    policy = sim.scheduler.policy
    long = sim.add("long", prompt_len=4, max_tokens=30)
    sim.run(until=lambda: policy.level(long) == 2)
    short = sim.add("short", prompt_len=4, max_tokens=3)  # level 0 outranks level 2
    sim.step()
    assert [p[1] for p in sim.preemptions] == ["long"]
    assert short.first_scheduled_step == sim.outputs[-1].step
    sim.run(until=lambda: short.is_finished)
    assert policy.level(long) == 2  # not a newcomer again: it comes back at its level
    sim.run()
    assert len(sim.preemptions) == 1
    sim.assert_all_free()
    # One level: an older waiting request ranks first but does not preempt a running one.
    older, running = Request.make("a", [1] * 4, 10, 0.0), Request.make("b", [1] * 4, 10, 5.0)
    assert policy.sort_key(older, 6.0) < policy.sort_key(running, 6.0)
    assert not policy.outranks(older, running, 6.0)


def test_a_long_job_under_a_stream_of_short_ones_finishes():
    """Each newcomer enters level 0 and, with active preemption, pushes the demoted long job
    out; only aging (one level per aging_s seconds since arrival) brings it back."""
    newcomer = {"prompt_len": 4, "max_tokens": 2}
    config = {"active_preemption": True, "min_run_quantum": 4, "preemption_mode": "recompute"}
    starved = run_with_stream("mlfq", 1e9, newcomer, 300, **config)
    assert "old" not in starved.finished_step
    sim = run_with_stream("mlfq", 5.0, newcomer, 300, **config)
    # old falls to level <= 3 (quanta 4, 8, 16 for its 20 tokens): at most 3 * 5 s of aging
    # lifts it to level 0, where it is the oldest and nobody outranks it; then its 20 tokens.
    assert sim.finished_step["old"] <= 3 * 5 + 4 + 20 + 2 + 20
    assert len(sim.finished_step) > 140  # and the stream kept flowing
