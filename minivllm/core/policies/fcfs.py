"""`fcfs`: first come, first served; the victim is the latest arrival."""

from __future__ import annotations

from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.request import Request


class FCFSPolicy(SchedulingPolicy):
    name = "fcfs"
    uses_length_predictor = False

    def sort_key(self, request: Request, now: float) -> tuple:
        return (request.arrival_time, request.request_id)

    def unranked(self, requests: list[Request], now: float) -> bool:
        return True  # sort_key only reads
