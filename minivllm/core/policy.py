"""Scheduling policies: how queues are ordered, who is preempted, who may preempt.

A policy ranks requests with `sort_key` (smaller runs first). From that one rule come
the order of the waiting, swapped and running queues, the victim when memory runs out
(the worst-ranked running request) and active preemption (a waiting request that
outranks a running one). Adding a policy is one class and one `@register` line.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from minivllm.core.length_predictor import LengthPredictor, make_length_predictor
from minivllm.core.request import Request

POLICIES: dict[str, type[SchedulingPolicy]] = {}


def register(name: str):
    def wrap(cls: type[SchedulingPolicy]) -> type[SchedulingPolicy]:
        cls.name = name
        POLICIES[name] = cls
        return cls

    return wrap


def make_policy(name: str, aging_s: float = 10.0,
                length_predictor: str = "mean", **options) -> SchedulingPolicy:
    """`options`: engine settings by name (vtc_weights, edf_action, ...); each policy takes
    those its `option_names` list and ignores the others."""
    if name not in POLICIES:
        raise ValueError(
            f"unknown scheduling_policy {name!r}; known policies: {', '.join(sorted(POLICIES))}"
        )
    cls = POLICIES[name]
    own = {k: v for k, v in options.items() if k in cls.option_names and v is not None}
    return cls(aging_s=aging_s, predictor=make_length_predictor(length_predictor), **own)


def policy_options(settings) -> dict:
    """Every policy's options read off `settings` (an EngineConfig, parsed flags) by name."""
    names = {name for cls in POLICIES.values() for name in cls.option_names}
    return {name: getattr(settings, name) for name in sorted(names) if hasattr(settings, name)}


class SchedulingPolicy(ABC):
    name = "abstract"
    uses_length_predictor = True  # False: its order ignores predicted output lengths
    option_names: tuple[str, ...] = ()  # the engine settings make_policy passes it
    shed_late = False  # finish queued requests late_requests() names
    token_budget = 512  # tokens per step; the scheduler sets max_num_batched_tokens

    def __init__(self, aging_s: float = 10.0, predictor: LengthPredictor | None = None) -> None:
        self.aging_s = aging_s
        # Output-length predictor (core/length_predictor.py), for policies that rank by it;
        # every policy feeds it finished requests, so the ranking quality can be reported.
        self.predictor = predictor if predictor is not None else make_length_predictor("mean")
        # How many prompt tokens the prefix cache would serve; set by the scheduler.
        self.cached_tokens: Callable[[Request], int] = lambda request: 0

    @abstractmethod
    def sort_key(self, request: Request, now: float) -> tuple:
        """Rank of a request; smaller runs first. Ties are broken by arrival."""

    def age(self, request: Request, now: float) -> float:
        """Seconds since arrival, what aging counts. It goes on while a request runs, so a
        request keeps the rank it has earned: a later arrival of the same rank never
        outranks it, and one that has aged past newcomers is not bounced back by them."""
        return max(0.0, now - request.arrival_time)

    def order(self, requests: list[Request], now: float) -> list[Request]:
        return sorted(requests, key=lambda r: self.sort_key(r, now))

    def victim(self, candidates: list[Request], now: float) -> Request:
        return max(candidates, key=lambda r: self.sort_key(r, now))

    def outranks(self, candidate: Request, running: Request, now: float) -> bool:
        return self.sort_key(candidate, now) < self.sort_key(running, now)

    # Hooks for policies that keep state (core/policies/): the scheduler calls each one.
    def on_arrival(self, request: Request, now: float) -> None:
        """A request was added (forked siblings are not: they join with their head)."""

    def on_step(self, running: list[Request], now: float) -> None:
        """A step is being scheduled; `running`: the running requests before it."""

    def on_removed(self, request: Request) -> None:
        """A request left the scheduler, finished or aborted (after on_finished)."""

    def late_requests(self, requests, now: float) -> list[Request]:
        """Requests that can no longer make their deadline (deadline policies): the
        scheduler counts them, and sheds the queued ones if `shed_late`."""
        return []

    def on_finished(self, request: Request) -> None:
        """Feedback when a request finishes (not aborted): the output-length predictor
        learns from it. A subclass that overrides it calls super()."""
        self.predictor.observe(request)


@register("fcfs")
class FCFSPolicy(SchedulingPolicy):
    """First come, first served; the victim is the latest arrival."""

    uses_length_predictor = False

    def sort_key(self, request: Request, now: float) -> tuple:
        return (request.arrival_time, request.request_id)


@register("priority")
class PriorityPolicy(SchedulingPolicy):
    """Lower `priority` runs first (as vLLM); ties by arrival. Every `aging_s` seconds of age
    improve a request's effective priority by one level, so nothing starves."""

    uses_length_predictor = False

    def sort_key(self, request: Request, now: float) -> tuple:
        effective = request.priority - self.age(request, now) / self.aging_s
        return (effective, request.arrival_time, request.request_id)


@register("sjf")
class ShortestJobFirstPolicy(SchedulingPolicy):
    """Shortest predicted remaining work first: prompt tokens still to compute (less what
    the prefix cache holds) plus predicted output tokens still to generate. Aging divides
    the work by (1 + age / aging_s), so a long job ends up outranking newcomers. Output
    lengths come from the policy's predictor (--length-predictor)."""

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


import minivllm.core.policies  # noqa: E402, F401  (registers mlfq, vtc, edf, hrrn)
