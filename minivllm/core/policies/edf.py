"""`edf`: earliest deadline first on per-request latency deadlines.

A request's deadlines come from its `ttft_slo_ms` / `e2e_slo_ms` (API fields), else from the
server's defaults (`--ttft-slo-ms`, `--e2e-slo-ms`). Until its first token its deadline is the
earlier of arrival + TTFT SLO and arrival + E2E SLO; after it, arrival + E2E SLO. A request
with neither has no deadline and ranks after all that have one, by arrival.

A request can no longer make it once its deadline has passed. `--edf-action` says what then:
`shed` finishes a queued one (waiting, or preempted) with an error -- the capacity goes to
requests that can still make theirs -- and ranks a running one last; `deprioritize` ranks
every late one after all on-time ones (by deadline among themselves). The scheduler counts
both (`minivllm:num_requests_shed`, `minivllm:num_requests_deprioritized` in /metrics).
"""

from __future__ import annotations

import math

from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.request import Request

EDF_ACTIONS = ("shed", "deprioritize")


class EarliestDeadlineFirstPolicy(SchedulingPolicy):
    name = "edf"
    uses_length_predictor = False
    option_names = ("edf_action", "ttft_slo_ms", "e2e_slo_ms")

    def __init__(self, aging_s: float = 10.0, predictor=None, edf_action: str = "shed",
                 ttft_slo_ms: float | None = None, e2e_slo_ms: float | None = None) -> None:
        super().__init__(aging_s, predictor)
        self.validate_options(edf_action=edf_action, ttft_slo_ms=ttft_slo_ms,
                              e2e_slo_ms=e2e_slo_ms)
        self.shed_late = edf_action == "shed"
        self.default_ttft_slo_ms, self.default_e2e_slo_ms = ttft_slo_ms, e2e_slo_ms

    @classmethod
    def validate_options(cls, edf_action: str = "shed", ttft_slo_ms: float | None = None,
                         e2e_slo_ms: float | None = None) -> None:
        if edf_action not in EDF_ACTIONS:
            raise ValueError(f"edf_action (--edf-action) must be shed or deprioritize, "
                             f"got {edf_action!r}")
        for name, slo in (("ttft_slo_ms", ttft_slo_ms), ("e2e_slo_ms", e2e_slo_ms)):
            if slo is not None and not 0 < slo < math.inf:
                raise ValueError(f"{name} must be > 0 (milliseconds), got {slo!r}")

    def deadline(self, request: Request) -> float:
        """The clock time by which the request's next SLO must be met (inf: none)."""
        own = request.core_request
        ttft = own.ttft_slo_ms if own.ttft_slo_ms is not None else self.default_ttft_slo_ms
        e2e = own.e2e_slo_ms if own.e2e_slo_ms is not None else self.default_e2e_slo_ms
        budgets = [e2e] if e2e is not None else []
        if ttft is not None and request.num_output_tokens == 0:
            budgets.append(ttft)
        return request.arrival_time + min(budgets) / 1000.0 if budgets else math.inf

    def is_late(self, request: Request, now: float) -> bool:
        return now > self.deadline(request)

    def late_requests(self, requests, now: float) -> list[Request]:
        return [r for r in requests if self.is_late(r, now)]

    def sort_key(self, request: Request, now: float) -> tuple:
        return (self.is_late(request, now), self.deadline(request), request.arrival_time,
                request.request_id)

    def unranked(self, requests: list[Request], now: float) -> bool:
        return True  # sort_key only reads (goodput's too: late_requests writes its set)


def own_deadlines(request: Request) -> str:
    """The deadlines the request gave itself, as a shed request's error names them."""
    own = request.core_request
    return ", ".join(f"{name}={value:g}" for name, value in
                     (("ttft_slo_ms", own.ttft_slo_ms), ("e2e_slo_ms", own.e2e_slo_ms))
                     if value is not None)
