"""target_tpot_ms: the scheduler's step-time model (core/step_cost.py) and how it packs a
step: prefill chunks cut so a step carrying decodes stays within the target, prompts still
admitted every step."""

from __future__ import annotations

import random

import pytest

from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.step_batch import StepBatch, step_batch
from minivllm.core.step_cost import OnlineStepCost
from tests.core.test_scheduler_policies import Sim

TRUE = [0.01, 0.001, 1e-6, 1e-5]  # step, per token, per prefill query-key pair, per context


def true_cost(b: StepBatch) -> float:
    return (TRUE[0] + TRUE[1] * b.num_tokens + TRUE[2] * b.prefill_attention
            + TRUE[3] * b.decode_context)


def random_batch(rng: random.Random) -> StepBatch:
    b = StepBatch()
    for _ in range(rng.randint(0, 8)):
        b.add(1, rng.randint(1, 500))
    for _ in range(rng.randint(0, 2)):
        b.add(rng.randint(2, 300), rng.randint(0, 300))
    return b


def test_the_model_learns_a_linear_cost():
    rng, model = random.Random(0), OnlineStepCost()
    for _ in range(200):
        b = random_batch(rng)
        if b.num_tokens:
            model.observe(b, true_cost(b))
    assert model.ready
    assert model.coefficients == pytest.approx(TRUE, rel=1e-3)
    probe = StepBatch()
    probe.add(1, 100)
    assert model.max_prefill_tokens(probe, context=0, limit=512, seconds=0.1) == \
        max(n for n in range(513) if true_cost(_with(probe, n)) <= 0.1)


def _with(batch: StepBatch, n: int) -> StepBatch:
    b = StepBatch(**batch.as_dict())
    b.add(n, 0)
    return b


def test_a_term_that_fits_negative_is_dropped_and_nothing_predicts_before_min_steps():
    model = OnlineStepCost(min_steps=4)
    rng = random.Random(1)
    for _ in range(4):
        assert not model.ready
        b = random_batch(rng)
        b.add(1, 10)
        # more context, less time: the context term would fit negative
        model.observe(b, 0.05 + 0.001 * b.num_tokens - 1e-6 * b.decode_context)
    assert model.ready and min(model.coefficients) >= 0


class TimedSim(Sim):
    """Sim whose steps take true_cost seconds, told to the scheduler as the engine does."""

    def __init__(self, **config) -> None:
        super().__init__("fcfs", **config)
        self.step_seconds: list[tuple[StepBatch, float]] = []
        schedule = self.scheduler.schedule

        def timed_schedule():
            out = schedule()
            batch = step_batch(out, self.scheduler.requests, self.config.block_size)
            self.step_seconds.append((batch, true_cost(batch)))
            self.scheduler.record_step_time(true_cost(batch))
            return out

        self.scheduler.schedule = timed_schedule


def run_mixed(target_tpot_ms: float | None) -> TimedSim:
    """Four long decodes running, then long prompts arriving one a step."""
    sim = TimedSim(num_blocks=2048, block_size=4, max_num_batched_tokens=256,
                   target_tpot_ms=target_tpot_ms)
    for i in range(4):
        sim.add(f"decode{i}", prompt_len=8, max_tokens=120)
    for _ in range(20):  # the model has seen prefills and decodes
        sim.step()
    for i in range(6):
        sim.add(f"prompt{i}", prompt_len=300, max_tokens=4)
        sim.step()
    sim.run()
    sim.assert_all_free()
    return sim


def test_steps_with_decodes_stay_within_the_target_and_prompts_still_start():
    target = 0.06
    packed = run_mixed(target * 1e3)
    with_decodes = [s for b, s in packed.step_seconds[20:] if b.num_decode_seqs]
    assert max(with_decodes) <= target * 1.001
    # every prompt prefilled (the run finished), in chunks the target allowed
    assert any(b.num_prefill_tokens for b, _ in packed.step_seconds[20:])
    # without the knob the same run packs 256-token chunks next to the decodes
    unpacked = run_mixed(None)
    assert max(s for b, s in unpacked.step_seconds[20:] if b.num_decode_seqs) > 2 * target


def test_the_first_prefill_of_a_step_gets_at_least_a_block():
    """A target the decodes alone exceed: a prompt still moves a block a step."""
    sim = run_mixed(1.0)  # 1 ms: less than any step
    prefill_steps = [b for b, _ in sim.step_seconds[20:] if b.num_prefill_tokens]
    assert prefill_steps and all(b.num_prefill_tokens >= 4 for b in prefill_steps)


@pytest.mark.parametrize("config,message", [
    ({"target_tpot_ms": 0}, "must be > 0"),
    ({"target_tpot_ms": 50, "enable_chunked_prefill": False}, "needs chunked prefill"),
])
def test_bad_target_tpot_is_named(config, message):
    with pytest.raises(ValueError, match=f"target_tpot_ms {message}"):
        SchedulerConfig(max_num_batched_tokens=4096, **config)
