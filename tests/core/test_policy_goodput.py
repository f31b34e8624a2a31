"""`goodput`: edf that turns away a queued request predicted to miss its TTFT deadline
(from the scheduler's step-time model) before it takes capacity from the ones that can
still make theirs. Driven on a virtual clock that advances by each step's cost, which the
scheduler is told, as the engine and the simulator tell it."""

from __future__ import annotations

import pytest

from minivllm.core.request import RequestStatus
from minivllm.core.step_batch import StepBatch, step_batch
from tests.core.test_scheduler_policies import Sim


def cost(b: StepBatch) -> float:
    return 0.02 + 0.001 * b.num_tokens + 1e-5 * b.decode_context


def serve_overload(policy: str, edf_action: str = "shed") -> tuple[int, int, Sim]:
    """160 requests of 100 prompt tokens, one every 50 ms (about 1.5x what the engine
    serves), each with a 1 s TTFT deadline. Returns (requests whose first token came within
    1 s, requests shed)."""
    sim = Sim(policy, num_blocks=4096, block_size=4, max_num_batched_tokens=256,
              policy_options={"edf_action": edf_action, "ttft_slo_ms": 1000.0})
    sched = sim.scheduler
    arrivals = [(0.05 * i, f"r{i}") for i in range(160)]
    first_token: dict[str, float] = {}
    sent: dict[str, float] = {}
    while arrivals or sched.has_unfinished_requests():
        while arrivals and arrivals[0][0] <= sim.clock.now:
            _, rid = arrivals.pop(0)
            sent[rid] = sim.clock.now  # its arrival, as the scheduler sees it (between steps)
            sim.add(rid, prompt_len=100, max_tokens=4)
        if not sched.has_unfinished_requests():
            sim.clock.now = arrivals[0][0]
            continue
        out = sched.schedule()
        seconds = cost(step_batch(out, sched.requests, sim.config.block_size))
        sched.record_step_time(seconds)
        sim.check(out)
        sim.apply_diffs(out)
        sim.run_model(out)
        sim.clock.now += seconds
        for request in sched.update_from_output(out, sim.sample(out)):
            first_token.setdefault(request.request_id, sim.clock.now)
            if request.num_output_tokens == request.max_tokens:
                sched.finish_request(request, RequestStatus.FINISHED_LENGTH)
        sched.deadlines.take_shed()
    met = sum(1 for rid, t in first_token.items() if t - sent[rid] <= 1.0)
    return met, sched.stats().num_requests_shed, sim


def test_goodput_sheds_early_and_more_requests_meet_the_deadline_than_under_edf():
    edf_met, edf_shed, edf = serve_overload("edf")
    met, shed, sim = serve_overload("goodput")
    assert met > edf_met, (met, edf_met)
    assert shed > 0
    assert sim.scheduler.step_cost.ready
    sim.assert_all_free()
    edf.assert_all_free()


def test_goodput_deprioritize_ranks_the_predicted_late_last_and_sheds_nothing():
    met, shed, sim = serve_overload("goodput", edf_action="deprioritize")
    assert shed == 0 and sim.scheduler.stats().num_requests_deprioritized > 0
    sim.assert_all_free()


def test_goodput_without_deadlines_is_arrival_order():
    sim = Sim("goodput", max_num_seqs=1)
    for i in range(3):
        sim.add(f"r{i}", prompt_len=5, max_tokens=2)
    sim.run()
    assert sim.admitted == ["r0", "r1", "r2"]


@pytest.mark.parametrize("options,message", [({"edf_action": "drop"}, "edf_action"),
                                             ({"ttft_slo_ms": -1.0}, "ttft_slo_ms")])
def test_goodput_options_are_edfs_and_checked(options, message):
    with pytest.raises(ValueError, match=message):
        Sim("goodput", policy_options=options)
