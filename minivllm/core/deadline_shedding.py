"""Deadline policies (edf, goodput) in the scheduler: each step, the requests the policy finds
past their deadline are shed if queued and the policy sheds (they free their place for
requests that can still make theirs; the engine takes them to report the error), else counted
once as deprioritized (the policy ranks them last)."""

from __future__ import annotations

from collections.abc import Iterable

from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.request import Request, RequestStatus


class DeadlineShedding:
    def __init__(self, policy: SchedulingPolicy) -> None:
        self.policy = policy
        self.shed: list[Request] = []  # shed since the engine last took them
        self.num_requests_shed = 0
        self.num_requests_deprioritized = 0
        self._late: set[str] = set()  # ids of those deprioritized (counted once)

    def to_shed(self, requests: Iterable[Request], now: float) -> list[Request]:
        """The late requests to shed now (the scheduler finishes them); the other late ones
        are counted as deprioritized."""
        shed = []
        for request in self.policy.late_requests(requests, now):
            if self.policy.shed_late and request.status is not RequestStatus.RUNNING:
                shed.append(request)
            elif request.request_id not in self._late:
                self._late.add(request.request_id)
                self.num_requests_deprioritized += 1
        self.shed += shed
        self.num_requests_shed += len(shed)
        return shed

    def take_shed(self) -> list[Request]:
        shed, self.shed = self.shed, []
        return shed

    def forget(self, request: Request) -> None:
        self._late.discard(request.request_id)
