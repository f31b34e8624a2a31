"""Active preemption evicts running requests for a better-ranked waiting one only when the
evictions admit it in that very step (in KV blocks and in max_num_seqs seats), and then only
as many as that takes. Evicting anyway would throw work away for nothing: the waiting request
would still wait. On the fake model and clock of tests/core/test_scheduler_policies.py."""

from __future__ import annotations

from minivllm.core.request import RequestStatus
from tests.core.test_scheduler_policies import Sim


def preemption_steps(sim: Sim) -> list[int]:
    return [step for step, _, _ in sim.preemptions]


def assert_admitted_when_preempting(sim: Sim, request_id: str) -> None:
    """Every step that preempted anything admitted `request_id` in that same step."""
    for out in sim.outputs:
        if out.preempted_req_ids:
            assert request_id in out.num_scheduled_tokens, (out.step, out.preempted_req_ids)


def test_no_eviction_when_the_freed_blocks_cannot_admit_the_request():
    """`peer` (outranking `big`) and `low` run; `big` needs 7 of the 10 blocks. Evicting `low`,
    the only request `big` outranks, leaves `peer`'s 4 or 5 blocks taken: too few, so `low`
    keeps running. Once `peer` has finished, `low`'s 4 blocks leave 6 free, and evicting it does
    admit `big`: then it is evicted."""
    sim = Sim("priority", aging_s=1e9, num_blocks=10, block_size=4, max_num_seqs=4,
              max_num_batched_tokens=64, active_preemption=True, min_run_quantum=0,
              preemption_mode="recompute")
    peer = sim.add("peer", prompt_len=12, max_tokens=8, priority=0)
    low = sim.add("low", prompt_len=8, max_tokens=16, priority=5)
    sim.step()
    big = sim.add("big", prompt_len=25, max_tokens=2, priority=1)
    sim.run(until=lambda: peer.is_finished)
    assert not sim.preemptions, "low was evicted although that could not admit big"
    assert big.status is RequestStatus.WAITING
    assert all("low" in out.num_scheduled_tokens for out in sim.outputs)  # never interrupted
    sim.run()
    assert [rid for _, rid, _ in sim.preemptions] == ["low"]
    assert preemption_steps(sim) == [big.first_scheduled_step]
    assert_admitted_when_preempting(sim, "big")
    assert low.status is RequestStatus.FINISHED_LENGTH
    sim.assert_all_free()


def test_no_eviction_when_the_freed_seats_cannot_admit_the_group():
    """max_num_seqs=2 is full with `peer` (outranking the group) and `low`; a group of n=2
    needs both seats, and only `low` can be evicted: nobody is, until `peer` has finished."""
    sim = Sim("priority", aging_s=1e9, num_blocks=64, block_size=4, max_num_seqs=2,
              active_preemption=True, min_run_quantum=0, preemption_mode="recompute")
    peer = sim.add("peer", prompt_len=4, max_tokens=6, priority=0)
    sim.add("low", prompt_len=4, max_tokens=20, priority=5)
    sim.step()
    group = sim.add("group", prompt_len=4, max_tokens=2, priority=1, n=2)
    sim.run(until=lambda: peer.is_finished)
    assert not sim.preemptions, "low was evicted although one seat cannot admit two sequences"
    assert group.status is RequestStatus.WAITING
    assert sim.kv.num_free_blocks > 32  # blocks were never short: the seats were
    sim.run()
    assert [rid for _, rid, _ in sim.preemptions] == ["low"]
    assert preemption_steps(sim) == [group.first_scheduled_step]
    assert_admitted_when_preempting(sim, "group")
    sim.assert_all_free()


def test_evicts_only_as_many_as_admitting_the_request_takes():
    """`big` outranks both running requests; evicting the worse-ranked one frees enough
    blocks, so the other keeps running."""
    sim = Sim("priority", aging_s=1e9, num_blocks=10, block_size=4, max_num_seqs=4,
              max_num_batched_tokens=64, active_preemption=True, min_run_quantum=0,
              preemption_mode="recompute")
    sim.add("low", prompt_len=12, max_tokens=4, priority=4)
    sim.add("lowest", prompt_len=12, max_tokens=4, priority=5)
    sim.step()  # each holds 3 blocks (4 after this step's decode): 2 free
    big = sim.add("big", prompt_len=20, max_tokens=2, priority=0)  # 5 blocks
    out = sim.step()
    assert out.preempted_req_ids == ["lowest"]
    assert "big" in out.num_scheduled_tokens and "low" in out.num_scheduled_tokens
    assert big.status is RequestStatus.RUNNING
    sim.run()
    sim.assert_all_free()
