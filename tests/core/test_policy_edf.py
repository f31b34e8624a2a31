"""edf on the fake clock (one second per step): earliest deadline first from per-request SLOs
or the server's defaults, late queued requests shed (or ranked last), both counted."""

from __future__ import annotations

import pytest

from minivllm.core.policy import make_policy
from minivllm.core.request import Request, RequestStatus
from tests.core.test_scheduler_policies import Sim


def test_earliest_deadline_first():
    sim = Sim("edf", max_num_seqs=1)
    sim.add("loose", ttft_slo_ms=50_000)
    sim.add("none")  # no deadline: after all that have one
    sim.add("tight", ttft_slo_ms=20_000)
    sim.add("e2e", e2e_slo_ms=30_000)
    sim.run()
    assert sim.admitted == ["tight", "e2e", "loose", "none"]
    stats = sim.scheduler.stats()
    assert stats.num_requests_shed == stats.num_requests_deprioritized == 0


def test_after_the_first_token_the_e2e_deadline_counts():
    policy = make_policy("edf", ttft_slo_ms=1000.0, e2e_slo_ms=9000.0)  # server defaults
    request = Request.make("r", [1, 2], 4, arrival_time=10.0)
    assert policy.deadline(request) == 11.0
    request.output_token_ids = [5]
    assert policy.deadline(request) == 19.0
    request.core_request.e2e_slo_ms = 4000.0  # the request's own beats the default
    assert policy.deadline(request) == 14.0


def test_shed_finishes_late_queued_requests_and_ranks_late_running_ones_last():
    sim = Sim("edf", max_num_seqs=1, policy_options={"edf_action": "shed"})
    running = sim.add("running", max_tokens=8, ttft_slo_ms=1_000, e2e_slo_ms=3_000)  # late
    # while it runs (its first token is in time)
    doomed = sim.add("doomed", max_tokens=2, ttft_slo_ms=2_000)  # waits 8 steps: shed
    fine = sim.add("fine", max_tokens=2, ttft_slo_ms=60_000)
    sim.run()
    assert doomed.status is RequestStatus.FINISHED_ABORTED
    assert sim.scheduler.deadlines.take_shed() == [doomed] and sim.scheduler.deadlines.take_shed() == []
    assert sim.scheduler.stats().num_requests_shed == 1
    assert running.status is fine.status is RequestStatus.FINISHED_LENGTH
    assert sim.scheduler.stats().num_requests_deprioritized == 1  # running: ranked last, not shed
    sim.assert_all_free()


def test_deprioritize_serves_late_requests_after_the_on_time_ones():
    sim = Sim("edf", max_num_seqs=1, policy_options={"edf_action": "deprioritize"})
    sim.add("first", max_tokens=6, ttft_slo_ms=1_000)
    late = sim.add("late", max_tokens=2, ttft_slo_ms=2_000)  # late by the time first is done
    sim.add("on-time", max_tokens=2, ttft_slo_ms=30_000)
    sim.run()
    assert sim.admitted == ["first", "on-time", "late"]
    assert late.status is RequestStatus.FINISHED_LENGTH
    assert sim.scheduler.stats().num_requests_shed == 0
    assert sim.scheduler.stats().num_requests_deprioritized == 1  # counted once, however long late


def test_bad_action_is_named():
    with pytest.raises(ValueError, match="edf_action .--edf-action. must be shed or deprioritize"):
        make_policy("edf", edf_action="drop")
