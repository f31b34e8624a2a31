"""`goodput`: earliest deadline first with admission by predicted TTFT — goodput (requests
per second that meet their SLOs, DistServe's metric) under overload. `edf` gives up on a
request once its deadline has passed; by then the request may have taken steps that made
others miss theirs too. This policy looks ahead: each step it walks the queued requests
still waiting for a first token in deadline order, adds up the prompt tokens to prefill
before each one's first token (those of the prefills running, then the queue ahead of it,
then its own), and predicts when that token comes from the scheduler's step-time model
(core/step_cost.py, learned from the steps run). A request predicted to miss its TTFT
deadline is late now: `--edf-action shed` turns it away (its tokens leave the sum, so the
ones behind it move up), `deprioritize` ranks it after the requests that can still make
theirs. Deadlines, options and the past-deadline rule are edf's; until the model has seen
enough steps (16) only past deadlines count.
"""

from __future__ import annotations

import math

from minivllm.core.policies.edf import EarliestDeadlineFirstPolicy
from minivllm.core.request import Request, RequestStatus


class GoodputAdmissionPolicy(EarliestDeadlineFirstPolicy):
    name = "goodput"
    needs_step_cost = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._predicted_late: set[str] = set()

    def first_token_deadline(self, request: Request) -> float:
        return self.deadline(request) if request.num_output_tokens == 0 else math.inf

    def late_requests(self, requests, now: float) -> list[Request]:
        requests = list(requests)
        late = [r for r in requests if self.is_late(r, now)]
        self._predicted_late = set()
        if self.prefill_seconds is None or self.prefill_seconds(1) is None:
            return late  # no step-time model yet
        ahead = sum(self._prefill_left(r) for r in requests
                    if r.status is RequestStatus.RUNNING and r.num_output_tokens == 0)
        queued = [r for r in requests if r.status is not RequestStatus.RUNNING
                  and r.num_output_tokens == 0 and not self.is_late(r, now)]
        for request in sorted(queued, key=lambda r: (self.deadline(r), r.arrival_time)):
            tokens = self._prefill_left(request)
            if now + self.prefill_seconds(ahead + tokens) > self.first_token_deadline(request):
                self._predicted_late.add(request.request_id)
                late.append(request)
            else:
                ahead += tokens
        return late

    def _prefill_left(self, request: Request) -> int:
        computed = request.num_computed_tokens
        if request.status is not RequestStatus.RUNNING:
            computed = max(computed, self.cached_tokens(request))
        return max(1, request.num_prompt_tokens - computed)

    def is_late_or_predicted(self, request: Request, now: float) -> bool:
        return self.is_late(request, now) or request.request_id in self._predicted_late

    def sort_key(self, request: Request, now: float) -> tuple:
        return (self.is_late_or_predicted(request, now), self.deadline(request),
                request.arrival_time, request.request_id)
