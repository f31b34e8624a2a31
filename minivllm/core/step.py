"""One engine step, the same code for EngineCore (around the model runner) and the simulator
(around a cost model on a virtual clock): schedule, let the executor run the
SchedulerOutput, then update the scheduler with what it sampled — which applies the stop
rule (core/stop.py) and finishes the requests it ends.

A step is two calls rather than one function taking the executor: a simulated forward
takes virtual time, during which other replicas step and new requests arrive, so the
simulator schedules at one instant and updates at another. The engine makes both calls
back to back around ModelRunner.execute.
"""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.core.request import Request
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_output import SchedulerOutput


@dataclass
class ScheduledStep:
    scheduler_output: SchedulerOutput
    # Queued requests the policy finished for a deadline they can no longer make (edf with
    # edf_action=shed): the caller fails them, as the server's 503.
    shed: list[Request]


@dataclass
class StepResult:
    # the requests that got a token (or, pooling, their pooled vector), in the step's order
    sampled: list[Request]
    finished: list[Request]  # of those, the ones it ended (their status says why)


class EngineStep:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def schedule(self) -> ScheduledStep:
        out = self.scheduler.schedule()
        return ScheduledStep(out, self.scheduler.deadlines.take_shed())

    def update(self, step: ScheduledStep, sampled_token_ids: dict[str, int],
               prompt_hidden: dict | None = None) -> StepResult:
        """What the executor sampled (request id -> token id) and, where the output asked
        for them, the prompts' last hidden states."""
        sampled = self.scheduler.update_from_output(step.scheduler_output, sampled_token_ids,
                                                    prompt_hidden)
        return StepResult(sampled, [r for r in sampled if r.status.finished])
