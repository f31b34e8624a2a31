"""`vtc`: Virtual Token Counter fair sharing across tenants (Sheng et al., "Fairness in Serving
Large Language Models", OSDI 2024). A tenant is a request's `user` (OpenAI's field; requests
without one share the anonymous tenant).

Each tenant has a counter of the service it got: w_p per prompt token, charged when a request
is first admitted, and w_q per output token (`--vtc-weights W_P,W_Q`, default 1,2 as in the
paper's experiments). The tenant with the smallest counter is served next, first come first
served within a tenant. A tenant that joins (its first unfinished request) has its counter
lifted to the smallest counter of the tenants already active, so it cannot bank service it
did not ask for while it was away. The paper's bound: two tenants that stay backlogged get
service within 2 * max(w_p * L_input, w_q * M) of each other over any interval, with L_input
the longest prompt and M the most tokens a batch holds.

Per-tenant weights (`--vtc-tenant-weights alice=2,bob=1`, the paper's weighted VTC): a
tenant's counter advances by its service divided by its weight, so of two backlogged tenants
one with weight 2 gets twice the service of one with weight 1. Unlisted tenants weigh 1.

Admission in one step picks requests one at a time, charging each one's prompt before the
next is picked; `order` plays that out so that a single step cannot admit a whole burst of
one tenant on a stale counter.
"""

from __future__ import annotations

import heapq
import json
import math
from collections import Counter, defaultdict

from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.request import Request
from minivllm.core.sequence_group import is_head


def parse_vtc_weights(value) -> tuple[float, float]:
    """'W_P,W_Q' (or a pair) -> two positive floats, or a ValueError naming the setting."""
    try:
        parts = value.split(",") if isinstance(value, str) else list(value)
        weights = tuple(float(p) for p in parts)
    except (TypeError, ValueError):
        weights = ()
    if len(weights) != 2 or not all(w > 0 and w != float("inf") for w in weights):
        raise ValueError("vtc_weights (--vtc-weights) must be two positive numbers W_P,W_Q "
                         f"(prompt and output token weights, e.g. 1,2), got {value!r}")
    return weights


def parse_vtc_tenant_weights(value) -> dict[str, float]:
    """'tenant=weight,tenant=weight', a JSON object or a mapping -> {tenant: positive float};
    None -> {}. A ValueError names the setting. The anonymous tenant (no `user`) is ''."""
    if value is None:
        return {}
    error = ValueError("vtc_tenant_weights (--vtc-tenant-weights) must be TENANT=WEIGHT pairs "
                       "separated by commas, or a JSON object, with positive weights (e.g. "
                       f"alice=2,bob=1), got {value!r}")
    try:
        if isinstance(value, str) and value.lstrip().startswith("{"):
            pairs = list(json.loads(value).items())
        elif isinstance(value, str):
            pairs = [item.rsplit("=", 1) for item in value.split(",")]
        else:
            pairs = list(dict(value).items())
        weights = {str(name).strip(): float(w) for name, w in pairs}
    except (AttributeError, TypeError, ValueError):  # JSONDecodeError is a ValueError
        raise error from None
    if len(weights) != len(pairs) or not all(w > 0 and math.isfinite(w) for w in weights.values()):
        raise error  # a tenant named twice, or a weight not positive and finite
    return weights


def tenant(request: Request) -> str:
    return request.core_request.user or ""


class VirtualTokenCounterPolicy(SchedulingPolicy):
    name = "vtc"
    uses_length_predictor = False
    option_names = ("vtc_weights", "vtc_tenant_weights")

    def __init__(self, aging_s: float = 10.0, predictor=None, vtc_weights=(1.0, 2.0),
                 vtc_tenant_weights=None) -> None:
        super().__init__(aging_s, predictor)
        self.prompt_weight, self.output_weight = parse_vtc_weights(vtc_weights)
        self.tenant_weights = parse_vtc_tenant_weights(vtc_tenant_weights)
        self.counters: defaultdict[str, float] = defaultdict(float)  # tenant -> service
        self.active: Counter[str] = Counter()  # tenant -> its unfinished requests
        self._members: set[str] = set()  # request ids counted in `active`
        self._charged: dict[str, float] = {}  # request id -> service charged so far

    @classmethod
    def validate_options(cls, vtc_weights="1,2", vtc_tenant_weights=None) -> None:
        parse_vtc_weights(vtc_weights)  # their errors name the setting
        parse_vtc_tenant_weights(vtc_tenant_weights)

    def advance(self, counters: dict[str, float], user: str, service: float) -> None:
        """Add service to a tenant's counter, scaled down by its weight."""
        counters[user] += service / self.tenant_weights.get(user, 1.0)

    def cost(self, request: Request) -> float:
        """The service a request has had: its prompt once admitted (the head of a parallel
        sampling group pays for the shared prompt), and its output tokens."""
        admitted = request.first_scheduled_step is not None and is_head(request)
        return (self.prompt_weight * request.num_prompt_tokens * admitted
                + self.output_weight * request.num_output_tokens)

    def charge(self, request: Request) -> None:
        cost = self.cost(request)
        delta = cost - self._charged.get(request.request_id, 0.0)
        if delta > 0:
            self.advance(self.counters, tenant(request), delta)
            self._charged[request.request_id] = cost

    def on_arrival(self, request: Request, now: float) -> None:
        user = tenant(request)
        if self.active[user] == 0:
            others = [self.counters[u] for u, n in self.active.items() if n > 0]
            if others:  # joining: no credit for the time away
                self.counters[user] = max(self.counters[user], min(others))
        self.active[user] += 1
        self._members.add(request.request_id)

    def on_step(self, running: list[Request], now: float) -> None:
        for request in running:
            self.charge(request)

    def on_removed(self, request: Request) -> None:
        self.charge(request)
        self._charged.pop(request.request_id, None)
        if request.request_id in self._members:
            self._members.discard(request.request_id)
            self.active[tenant(request)] -= 1

    def sort_key(self, request: Request, now: float) -> tuple:
        return (self.counters[tenant(request)], request.arrival_time, request.request_id)

    def order(self, requests: list[Request], now: float) -> list[Request]:
        """The least-served tenant's oldest request, then again with that request's prompt
        charged to its tenant (as if admitted), and so on."""
        queues: defaultdict[str, list[Request]] = defaultdict(list)
        for request in sorted(requests, key=lambda r: (r.arrival_time, r.request_id)):
            queues[tenant(request)].append(request)
        projected = {user: self.counters[user] for user in queues}
        heap = [(projected[u], q[0].arrival_time, q[0].request_id, u) for u, q in queues.items()]
        heapq.heapify(heap)
        position = dict.fromkeys(queues, 0)
        ordered = []
        while heap:
            _, _, _, user = heapq.heappop(heap)
            request = queues[user][position[user]]
            ordered.append(request)
            if request.first_scheduled_step is None:
                self.advance(projected, user, self.prompt_weight * request.num_prompt_tokens)
            position[user] += 1
            if position[user] < len(queues[user]):
                nxt = queues[user][position[user]]
                heapq.heappush(heap, (projected[user], nxt.arrival_time, nxt.request_id, user))
        return ordered
