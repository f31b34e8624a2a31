"""`priority`: lower `priority` runs first (as vLLM); ties by arrival. Every `aging_s` seconds
of age improve a request's effective priority by one level, so nothing starves."""

from __future__ import annotations

from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.request import Request


class PriorityPolicy(SchedulingPolicy):
    name = "priority"
    uses_length_predictor = False

    def sort_key(self, request: Request, now: float) -> tuple:
        # self.age, inlined (a conditional, not a max() call: the same value): sort_key runs
        # for every queued request at every step
        age = now - request.arrival_time
        effective = request.core_request.priority - (age if age > 0.0 else 0.0) / self.aging_s
        return (effective, request.arrival_time, request.request_id)

    def unranked(self, requests: list[Request], now: float) -> bool:
        return True  # sort_key only reads
