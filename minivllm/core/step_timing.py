"""The scheduler's step-time model at work (core/step_cost.py is the model): with
target_tpot_ms or a policy that predicts (goodput), each step's composition is paired with
the time the step took, and the policy may ask how long a prefill would take beside the
running decodes."""

from __future__ import annotations

from collections.abc import Callable

from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.request import Request
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.core.step_batch import StepBatch, step_batch
from minivllm.core.step_cost import OnlineStepCost


class StepTiming:
    def __init__(self, config: SchedulerConfig, policy: SchedulingPolicy,
                 running: list[Request], step_count: Callable[[], int]) -> None:
        """`running`: the scheduler's running queue; `step_count()`: its step now."""
        self.config = config
        self.cost = (OnlineStepCost() if config.target_tpot_ms is not None
                     or policy.needs_step_cost else None)
        self._running = running
        self._step_count = step_count
        self._last_batch: StepBatch | None = None  # the last step scheduled, not yet timed
        self._decodes_at: tuple[int, StepBatch] = (-1, StepBatch())  # prefill_seconds' cache
        if policy.needs_step_cost:
            policy.prefill_seconds = self.prefill_seconds

    def scheduled(self, out: SchedulerOutput, requests: dict[str, Request]) -> None:
        """A step was scheduled: its composition waits for the time it takes."""
        if self.cost is not None:
            self._last_batch = step_batch(out, requests, self.config.block_size)

    def observe(self, seconds: float) -> None:
        """The step last scheduled took `seconds`."""
        if self.cost is not None and self._last_batch is not None:
            self.cost.observe(self._last_batch, seconds)
            self._last_batch = None

    def prefill_seconds(self, num_tokens: int) -> float | None:
        """Predicted seconds to prefill num_tokens prompt tokens in steps beside the running
        decodes (the goodput policy asks), None before the step-time model is ready."""
        if not self.cost.ready:
            return None
        step = self._step_count()
        if self._decodes_at[0] != step:  # the running decodes, once a step
            decodes = StepBatch()
            for request in self._running:
                if request.num_tokens - request.num_computed_tokens <= 1:
                    decodes.add(1, request.num_computed_tokens)
            self._decodes_at = (step, decodes)
        return self.cost.prefill_seconds(self._decodes_at[1], num_tokens,
                                         self.config.max_num_batched_tokens)
