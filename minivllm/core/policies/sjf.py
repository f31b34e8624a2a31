"""`sjf`: shortest predicted remaining work first: prompt tokens still to compute (less what
the prefix cache holds) plus predicted output tokens still to generate. Aging divides the
work by (1 + age / aging_s), so a long job ends up outranking newcomers. Output lengths come
from the policy's predictor (--length-predictor)."""

from __future__ import annotations

from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.request import Request


class ShortestJobFirstPolicy(SchedulingPolicy):
    name = "sjf"

    def remaining_work(self, request: Request) -> int:
        computed = request.num_computed_tokens
        if computed < request.num_prompt_tokens:  # else no prompt is left: skip the probe
            computed = max(computed, self.cached_tokens(request))
        prompt_left = max(0, request.num_prompt_tokens - computed)
        output_left = max(1, self.predictor.predict(request) - request.num_output_tokens)
        return prompt_left + output_left

    def sort_key(self, request: Request, now: float) -> tuple:
        effective = self.remaining_work(request) / (1.0 + self.age(request, now) / self.aging_s)
        return (effective, request.arrival_time, request.request_id)

    def unranked(self, requests: list[Request], now: float) -> bool:
        return self.predictor.unasked(requests)  # the rest of sort_key only reads
