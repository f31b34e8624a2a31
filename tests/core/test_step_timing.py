"""StepTiming on its own: a step's composition paired with the time it took (once), nothing
kept without a step-time model, and the goodput policy's prefill estimate beside the running
decodes, those counted once a step."""

from __future__ import annotations

from minivllm.core.policy import make_policy
from minivllm.core.request import Request
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.core.step_timing import StepTiming


def timing(policy: str = "fcfs", target_tpot_ms: float | None = 50.0, step: list | None = None):
    config = SchedulerConfig(num_blocks=64, block_size=4, max_num_batched_tokens=16,
                             target_tpot_ms=target_tpot_ms)
    running: list[Request] = []
    step = step if step is not None else [1]
    return StepTiming(config, make_policy(policy), running, lambda: step[0]), running


def scheduled_step(t: StepTiming, num_tokens: int) -> None:
    request = Request.make("r", list(range(num_tokens)), max_tokens=4)
    out = SchedulerOutput(step=1)
    out.num_scheduled_tokens["r"] = num_tokens
    t.scheduled(out, {"r": request})


def test_each_scheduled_step_is_observed_once():
    t, _ = timing()
    scheduled_step(t, 8)
    t.observe(0.1)
    t.observe(0.1)  # no step scheduled since: nothing to pair it with
    assert t.cost.num_steps == 1


def test_no_model_without_a_target_or_a_policy_that_predicts():
    t, _ = timing(target_tpot_ms=None)
    assert t.cost is None
    scheduled_step(t, 8)
    t.observe(0.1)  # nothing to learn into
    predicting, _ = timing("goodput", target_tpot_ms=None)
    assert predicting.cost is not None


def test_the_goodput_policy_asks_for_prefill_seconds_beside_the_decodes_once_a_step():
    step = [1]
    t, running = timing("goodput", step=step)
    assert t.prefill_seconds(8) is None  # not ready yet
    for n in range(t.cost.min_steps):
        scheduled_step(t, 2 + n % 5)
        t.observe(0.01 * (2 + n % 5))
    alone = t.prefill_seconds(8)
    decoding = Request.make("d", [1, 2, 3], max_tokens=4)
    decoding.num_computed_tokens = 2  # one token left: a decode
    running.append(decoding)
    assert t.prefill_seconds(8) == alone  # the decodes were counted once this step
    step[0] += 1
    assert t.prefill_seconds(8) > alone
