"""Preemption's pluggable parts: which running request is the victim, and what recompute
preemption costs.

Victim rules (`--preemption-victim`), each a function of the candidates, the policy and the
clock; the scheduler asks one when KV blocks run out, and (with active preemption) among the
running requests a better-ranked waiting one outranks, when blocks or `max_num_seqs` seats
run out:
- `lowest_rank` (default): the request the policy ranks worst (its `sort_key`).
- `latest_arrival`: the most recent arrival, whatever the policy (vLLM's rule).
- `least_work_done`: the one with the fewest computed tokens, so recompute throws away the
  least; ties go to the worst-ranked.

The recompute tax: a request preempted by recompute drops its KV and later computes its
tokens again. `RecomputeTax` counts those tokens (beyond the request's high-water mark of
computed tokens, prefix-cache hits excluded since they are not computed) against every token
computed.
"""

from __future__ import annotations

from collections.abc import Callable

from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.request import Request

VictimRule = Callable[[list[Request], SchedulingPolicy, float], Request]


def lowest_rank(candidates: list[Request], policy: SchedulingPolicy, now: float) -> Request:
    return policy.victim(candidates, now)


def latest_arrival(candidates: list[Request], policy: SchedulingPolicy, now: float) -> Request:
    return max(candidates, key=lambda r: (r.arrival_time, r.request_id))


def least_work_done(candidates: list[Request], policy: SchedulingPolicy, now: float) -> Request:
    fewest = min(r.num_computed_tokens for r in candidates)
    return lowest_rank([r for r in candidates if r.num_computed_tokens == fewest], policy, now)


VICTIM_RULES: dict[str, VictimRule] = {
    "lowest_rank": lowest_rank,
    "latest_arrival": latest_arrival,
    "least_work_done": least_work_done,
}


def victim_rule(name: str) -> VictimRule:
    """The rule of that name; a ValueError naming the known ones (SchedulerConfig checks
    --preemption-victim with it)."""
    if name not in VICTIM_RULES:
        raise ValueError(f"preemption_victim must be one of {', '.join(VICTIM_RULES)}, "
                         f"got {name!r}")
    return VICTIM_RULES[name]


class RecomputeTax:
    """Tokens computed again after recompute preemption, and all tokens computed."""

    def __init__(self) -> None:
        self.num_recomputed_tokens = 0
        self.num_computed_tokens_total = 0
        self._high: dict[str, int] = {}  # request id -> most tokens it ever had computed

    def count(self, request: Request, num_new: int) -> None:
        """The step computed `num_new` tokens of the request from its num_computed_tokens."""
        start, end = request.num_computed_tokens, request.num_computed_tokens + num_new
        high = self._high.get(request.request_id, 0)
        self.num_computed_tokens_total += num_new
        self.num_recomputed_tokens += max(0, min(end, high) - start)
        self._high[request.request_id] = max(high, end)

    def forked(self, parent: Request, child: Request) -> None:
        """A sibling starts with its parent's computed tokens: losing them costs it too."""
        self._high[child.request_id] = parent.num_computed_tokens

    def forget(self, request: Request) -> None:
        self._high.pop(request.request_id, None)

    @property
    def share(self) -> float:
        """Recomputed tokens as a share of all computed tokens (0 before any)."""
        total = self.num_computed_tokens_total
        return self.num_recomputed_tokens / total if total else 0.0
