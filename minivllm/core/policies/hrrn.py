"""`hrrn`: highest response ratio next, (wait + predicted service) / predicted service.

Like SJF it favours short work, but a request's ratio grows with its wait, so no stream of
short requests starves a long one (no aging needed). The predicted service time of a request is
the steps it still needs -- ceil(uncached prompt tokens left / the step's token budget), plus
the output tokens the length predictor (`--length-predictor`) says are left -- times the step
time, the median of the intervals between the scheduler's recent steps. The wait counts from
arrival, for running requests too, so a request keeps the rank it has earned.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.request import Request


class HighestResponseRatioNextPolicy(SchedulingPolicy):
    name = "hrrn"
    def __init__(self, aging_s: float = 10.0, predictor=None) -> None:
        super().__init__(aging_s, predictor)
        self._last_step: float | None = None
        self._intervals: deque[float] = deque(maxlen=64)

    def on_step(self, running: list[Request], now: float) -> None:
        if self._last_step is not None and now > self._last_step:
            self._intervals.append(now - self._last_step)
        self._last_step = now

    @property
    def step_time(self) -> float:
        """Seconds per step: the median recent interval (1 s before any was seen)."""
        return statistics.median(self._intervals) if self._intervals else 1.0

    def steps_left(self, request: Request) -> int:
        computed = request.num_computed_tokens
        if computed < request.num_prompt_tokens:
            computed = max(computed, self.cached_tokens(request))
        prompt_left = max(0, request.num_prompt_tokens - computed)
        output_left = max(1, math.ceil(self.predictor.predict(request))
                          - request.num_output_tokens)
        return math.ceil(prompt_left / self.token_budget) + output_left

    def response_ratio(self, request: Request, now: float) -> float:
        service = self.steps_left(request) * self.step_time
        return (self.age(request, now) + service) / service

    def sort_key(self, request: Request, now: float) -> tuple:
        # Equal ratios (all 1 for requests that have not waited): the shorter first.
        return (-self.response_ratio(request, now), self.steps_left(request),
                request.arrival_time, request.request_id)

    def unranked(self, requests: list[Request], now: float) -> bool:
        return self.predictor.unasked(requests)  # the rest of sort_key only reads
