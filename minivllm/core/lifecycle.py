"""Request lifecycles and the KV block map, for the live dashboard and the reports' timelines.

LifecycleTracer watches a Scheduler from the outside: after each step (and after requests
came or went between steps) `observe()` compares what it sees with what it saw and records
one event per change of state, never one per token:

    queued -> prefill (one event per chunk) -> decode -> preempted (recompute) or swapped
           -> ... -> finished (stop / length) or aborted

A Gantt bar is the events of one request in order: each state lasts until the next event.
The engine core runs a tracer only while someone listens (the dashboard); the simulator runs
one for its report. `block_map()` summarizes the KV pool: free, in use, cached (free but
holding a prefix-cache block, evictable) and, in the host pool, swapped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from minivllm.core.kv_cache import KVCacheManager
from minivllm.core.request import Request, RequestStatus
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_output import SchedulerOutput

STATES = ("queued", "prefill", "decode", "preempted", "swapped", "finished", "aborted")
MAX_RANKED = 64  # the ranks a sample carries: the head of the policy's queue is what matters


@dataclass
class LifecycleEvent:
    """A request entered `state` at time `t` (seconds since the epoch, or the simulator's
    clock). `tokens`: queued: prompt tokens; prefill: the chunk; finished / aborted: output
    tokens. `rank`: its place in the policy's order of the waiting and swapped requests
    (0 first), on queued / preempted / swapped. `reason`: finished: stop or length."""

    t: float
    request_id: str
    state: str
    tokens: int = 0
    priority: int | None = None
    user: str | None = None
    rank: int | None = None
    reason: str | None = None


@dataclass
class TraceSample:
    """What the tracer saw since the last sample: lifecycle events, how full the steps were
    against the token budget, the block map, and the ranks of the requests not running."""

    events: list[LifecycleEvent]
    num_steps: int
    scheduled_tokens: int  # over those steps
    max_step_tokens: int
    token_budget: int  # max_num_batched_tokens
    block_map: dict | None
    ranks: dict[str, int]


class LifecycleTracer:
    def __init__(self, scheduler: Scheduler, now: float,
                 user_of: Callable[[Request], str | None] = (
                     lambda request: request.core_request.user)
                 ) -> None:
        """Starts with what the scheduler holds now: a request already running shows as
        queued since its arrival, then in its present state from `now`. `user_of`: the name
        events give a request's user (default: its `user`, OpenAI's field)."""
        self.scheduler = scheduler
        self.user_of = user_of
        self._seen: dict[str, tuple[Request, str]] = {}  # request id -> (request, state)
        self._events: list[LifecycleEvent] = []
        self._ranks: dict[str, int] | None = None  # this observe()'s, computed when needed
        self._steps = self._tokens = self._max_tokens = 0
        for request in scheduler.requests.values():
            self._arrived(request, now)
            present = {RequestStatus.SWAPPED: "swapped",
                       RequestStatus.RUNNING: "prefill" if self._prefilling(request)
                       else "decode"}.get(request.status)
            if request.status is RequestStatus.WAITING and request.num_preemptions:
                present = "preempted"
            if present is not None:
                self._enter(request, present, now)

    def see_arrivals(self, now: float) -> None:
        """Right after schedule(): the requests added since, before a step can finish them."""
        self._ranks = None
        # The scheduler's dict keeps insertion order and new requests (forks too) go last:
        # the new ones are those after the last one seen.
        requests = self.scheduler.requests
        new = []
        for rid in reversed(requests):
            if rid in self._seen:
                break
            new.append(requests[rid])
        for request in reversed(new):
            self._arrived(request, now)

    def observe(self, started: float, ended: float, out: SchedulerOutput | None = None) -> None:
        """After a step that began (was scheduled) at `started` and ended at `ended`, its
        output `out`; or, with no step, after requests were added or aborted."""
        s = self.scheduler
        self.see_arrivals(started)
        if out is not None:
            self._stepped(out, started)
        # Every request the scheduler holds has been seen: more seen means some have left.
        gone = [] if len(self._seen) == len(s.requests) else [
            rid for rid in self._seen if rid not in s.requests]
        for request_id in gone:
            request, _ = self._seen.pop(request_id)
            aborted = request.status is RequestStatus.FINISHED_ABORTED
            self._events.append(LifecycleEvent(
                ended, request_id, "aborted" if aborted else "finished",
                tokens=request.num_output_tokens,
                reason=None if aborted else request.status.value))

    def _arrived(self, request: Request, now: float) -> None:
        rid = request.request_id
        self._events.append(LifecycleEvent(
            request.arrival_time, rid, "queued", tokens=request.num_prompt_tokens,
            priority=request.core_request.priority, user=self.user_of(request),
            rank=self._rank(rid, now)))
        self._seen[rid] = (request, "queued")

    @staticmethod
    def _prefilling(request: Request) -> bool:
        return request.num_computed_tokens < request.num_tokens - 1

    def _stepped(self, out: SchedulerOutput, started: float) -> None:
        s = self.scheduler
        for rid in out.preempted_req_ids:
            request = s.requests.get(rid)
            if request is not None:
                swapped = request.status is RequestStatus.SWAPPED
                self._enter(request, "swapped" if swapped else "preempted", started)
        total = 0
        for rid, num_new in out.num_scheduled_tokens.items():
            total += num_new
            seen = self._seen.get(rid)
            if seen is None:
                continue
            request, state = seen
            # Counts have advanced: the chunk began at computed - num_new. A prefill chunk
            # computes prompt tokens, or more than one token (a recompute after preemption).
            start = request.num_computed_tokens - num_new
            if num_new > 1 or start < request.num_prompt_tokens:
                self._enter(request, "prefill", started, tokens=num_new)
            elif state != "decode":
                self._enter(request, "decode", started)
        self._steps += 1
        self._tokens += total
        self._max_tokens = max(self._max_tokens, total)

    def _enter(self, request: Request, state: str, t: float, tokens: int = 0) -> None:
        rid = request.request_id
        rank = self._rank(rid, t) if state in ("preempted", "swapped") else None
        self._events.append(LifecycleEvent(t, rid, state, tokens=tokens, rank=rank))
        self._seen[rid] = (request, state)

    def _rank(self, request_id: str, now: float) -> int | None:
        if self._ranks is None:
            s = self.scheduler
            order = s.policy.order(s.waiting + s.swapped, now)
            self._ranks = {r.request_id: i for i, r in enumerate(order)}
        return self._ranks.get(request_id)

    def take(self, now: float, with_block_map: bool) -> TraceSample:
        """The events and step figures since the last take; the block map and ranks now."""
        s = self.scheduler
        self._ranks = None
        order = s.policy.order(s.waiting + s.swapped, now)[:MAX_RANKED]
        sample = TraceSample(
            self._events, self._steps, self._tokens, self._max_tokens,
            s.config.max_num_batched_tokens, block_map(s.kv) if with_block_map else None,
            {r.request_id: i for i, r in enumerate(order)})
        self._events = []
        self._steps = self._tokens = self._max_tokens = 0
        return sample


def block_map(kv: KVCacheManager, max_cells: int = 256) -> dict:
    """The KV pool in brief: exact counts, and the blocks in id order folded into at most
    `max_cells` cells, one letter each, the state most of the cell's blocks are in:
    u in use, c cached (free but holding a prefix-cache block: evictable), f free; the host
    pool likewise, s swapped out, f free."""
    device = ["u" if m.ref_cnt else "c" if m.hash is not None else "f" for m in kv.blocks]
    free_host = set(kv.free_swap_blocks)
    host = ["f" if b in free_host else "s" for b in range(kv.num_swap_blocks)]
    return {"total": kv.num_blocks, "in_use": device.count("u"), "cached": device.count("c"),
            "free": device.count("f"), "swap_total": kv.num_swap_blocks,
            "swapped": kv.num_swap_blocks - len(free_host),
            "cells": _fold(device, max_cells), "swap_cells": _fold(host, max_cells)}


def _fold(states: list[str], max_cells: int) -> dict:
    """{"per_cell": blocks per cell, "map": one letter per cell}."""
    per_cell = max(1, -(-len(states) // max_cells))
    letters = []
    for start in range(0, len(states), per_cell):
        cell = states[start:start + per_cell]
        letters.append(max(sorted(set(cell)), key=cell.count))
    return {"per_cell": per_cell, "map": "".join(letters)}
