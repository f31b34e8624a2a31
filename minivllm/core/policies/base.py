"""The scheduling-policy interface: one rule, `sort_key` (smaller runs first), gives the order
of the waiting, swapped and running queues, the victim when memory runs out (the worst-ranked
running request) and active preemption (a waiting request that outranks a running one).
The registry, the factory and the settings are core/policy.py's."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from minivllm.core.length_predictor import LengthPredictor, make_length_predictor
from minivllm.core.request import Request


class SchedulingPolicy(ABC):
    name = "abstract"  # its --scheduling-policy name
    uses_length_predictor = True  # False: its order ignores predicted output lengths
    option_names: tuple[str, ...] = ()  # its settings (PolicyConfig fields) make_policy passes
    shed_late = False  # finish queued requests late_requests() names
    token_budget = 512  # tokens per step; the scheduler's max_num_batched_tokens (attach)
    needs_step_cost = False  # True: the scheduler learns its step times (core/step_cost.py)
    block_size = 16  # tokens per KV block; the scheduler's (attach)

    def __init__(self, aging_s: float = 10.0, predictor: LengthPredictor | None = None) -> None:
        self.aging_s = aging_s
        # Output-length predictor (core/length_predictor.py), for policies that rank by it;
        # every policy feeds it finished requests, so the ranking quality can be reported.
        self.predictor = predictor if predictor is not None else make_length_predictor("mean")
        # How many prompt tokens the prefix cache would serve (attach).
        self.cached_tokens: Callable[[Request], int] = lambda request: 0
        # Seconds to prefill N tokens next to the running decodes, from the scheduler's
        # step-time model (None before it has seen enough steps); attached where
        # needs_step_cost.
        self.prefill_seconds: Callable[[int], float | None] | None = None

    @classmethod
    def validate_options(cls, **options) -> None:
        """Raise a ValueError naming the setting if one of `options` (the set ones among
        option_names) is bad. PolicyConfig asks every policy when the engine's config is built,
        so a bad flag fails at start-up whichever policy runs; constructors ask too."""

    def attach(self, cached_tokens: Callable[[Request], int], token_budget: int,
               block_size: int = 16) -> None:
        """Called by the scheduler that ranks with this policy: how many prompt tokens its
        prefix cache would serve a request, its tokens per step and per KV block."""
        self.cached_tokens = cached_tokens
        self.token_budget = token_budget
        self.block_size = block_size

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

    def unranked(self, requests: list[Request], now: float) -> bool:
        """The scheduler leaves `requests` unranked now (no order of them could admit one
        this step): do what ranking them would have changed in this policy's state, and
        return True. False, the default: it cannot say, and the scheduler ranks them as
        ever. A policy whose sort_key writes nothing (reads of the prefix cache's
        remembered lookups give the same answers whenever asked) returns True; one that
        asks the length predictor defers to `predictor.unasked`."""
        return False

    def victim(self, candidates: list[Request], now: float) -> Request:
        return max(candidates, key=lambda r: self.sort_key(r, now))

    def outranks(self, candidate: Request, running: Request, now: float) -> bool:
        return self.sort_key(candidate, now) < self.sort_key(running, now)

    # Hooks for policies that keep state: the scheduler calls each one.
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
