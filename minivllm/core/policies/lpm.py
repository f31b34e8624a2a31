"""`lpm`: longest prefix match first (SGLang's `lpm`, vLLM RFC #42185's cache-aware ordering):
the queued request with the most prompt tokens in the prefix cache goes first, so requests
that share a cached prefix run while their blocks are still cached, instead of after other
requests have evicted them; and their prefill is shorter, so more prompts start per step.

Starvation guard: a request queued `priority_aging_s` seconds or more (its age since
arrival) goes before every younger one, oldest first — plain FCFS for it. Running requests
rank by the tokens they have computed (most first), so the victim when memory runs out is
the one that loses the least to recompute.
"""

from __future__ import annotations

from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.request import Request, RequestStatus


class LongestPrefixMatchPolicy(SchedulingPolicy):
    name = "lpm"
    uses_length_predictor = False

    def matched_tokens(self, request: Request) -> int:
        if request.status is RequestStatus.RUNNING:
            return request.num_computed_tokens
        return max(request.num_computed_tokens, self.cached_tokens(request))

    def sort_key(self, request: Request, now: float) -> tuple:
        if self.age(request, now) >= self.aging_s:
            return (0, request.arrival_time, request.request_id)
        return (1, -self.matched_tokens(request), request.arrival_time, request.request_id)

    def unranked(self, requests: list[Request], now: float) -> bool:
        return True  # sort_key only reads
