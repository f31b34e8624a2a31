"""hrrn on the fake clock: the response ratio from the measured step time and the predicted
service; short work first among equals in waiting; a long request's ratio grows until it
beats a stream of short newcomers. And sjf, priority and hrrn with every length predictor."""

from __future__ import annotations

import pytest

from minivllm.core.length_predictor import LENGTH_PREDICTORS
from minivllm.core.policy import make_policy
from minivllm.core.request import Request
from tests.core.test_scheduler_policies import Sim, run_with_stream


def test_response_ratio_from_step_time_and_predicted_service():
    policy = make_policy("hrrn")
    policy.token_budget = 16
    for now in (0.0, 0.5, 1.0, 1.5):  # steps every 0.5 s
        policy.on_step([], now)
    assert policy.step_time == 0.5
    request = Request.make("r", [1] * 40, max_tokens=6, arrival_time=0.0)
    # ceil(40 / 16) = 3 prefill steps + 6 predicted output tokens (max_tokens: none finished)
    assert policy.steps_left(request) == 9
    assert policy.response_ratio(request, 9.0) == pytest.approx((9.0 + 4.5) / 4.5)


def test_shorter_work_first_among_simultaneous_arrivals():
    sim = Sim("hrrn", max_num_seqs=1, policy_options={"length_predictor": "oracle"})
    for name, length in [("long", 12), ("short", 2), ("medium", 6)]:
        sim.add(name, prompt_len=4, max_tokens=12, oracle_output_len=length)
    sim.run()
    # Each waited as long as the others: the ratios order by predicted service alone.
    assert sim.admitted == ["short", "medium", "long"]


@pytest.mark.parametrize("active", [False, True])
def test_a_long_request_is_not_starved_by_short_newcomers(active):
    config = {"active_preemption": active, "min_run_quantum": 4}
    sim = run_with_stream("hrrn", 1e9, {"prompt_len": 4, "max_tokens": 2}, 300, **config)
    # old's ratio (age + 20) / 20 passes a newcomer's (~0 + 2) / 2 once it has waited
    # ~20 steps; then it runs its 20 tokens.
    assert sim.finished_step["old"] <= 20 + 4 + 20 + 4
    assert len(sim.finished_step) > 140


@pytest.mark.parametrize("predictor", sorted(LENGTH_PREDICTORS))
@pytest.mark.parametrize("policy", ["sjf", "priority", "hrrn"])
def test_policies_work_with_every_length_predictor(policy, predictor):
    """Requests with equal max_tokens but different true lengths (the oracle's field): every
    combination serves them all; with the oracle, sjf and hrrn take the short ones first."""
    sim = Sim(policy, max_num_seqs=1, policy_options={"length_predictor": predictor})
    for true_len in [9, 2, 5]:
        sim.add(f"r{true_len}", prompt_len=4, max_tokens=true_len, oracle_output_len=true_len)
    sim.run()
    sim.assert_all_free()
    if predictor == "oracle" and policy != "priority":
        assert sim.admitted == ["r2", "r5", "r9"]
