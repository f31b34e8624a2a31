"""Preemption at work: taking running requests off the device when KV blocks run out, or (active
preemption) to admit a waiting request that outranks them. A victim gives back what it was
given this step and is either swapped (its blocks copied to host memory; it waits in the
swapped queue to be swapped back in) or recomputed (its blocks freed; back to the waiting
queue, its tokens to be computed again). The victim rules and the recompute tax are
core/preemption.py's."""

from __future__ import annotations

import logging
from collections.abc import Callable

from minivllm.core import sequence_group
from minivllm.core.block_table_diffs import BlockTableDiffs
from minivllm.core.kv_cache import KVCacheManager
from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.preemption import victim_rule
from minivllm.core.request import Request, RequestStatus
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.core.step_budget import StepBudget

# The warning names the scheduler, whose preemptions these are (the simulator quiets it).
logger = logging.getLogger("minivllm.core.scheduler")


class Preemptor:
    def __init__(self, config: SchedulerConfig, policy: SchedulingPolicy, kv: KVCacheManager,
                 running: list[Request], waiting: list[Request], swapped: list[Request],
                 block_tables: BlockTableDiffs) -> None:
        """`running`, `waiting`, `swapped`: the scheduler's queues, which it moves victims
        between; `block_tables`: the runner's view, told to resend a victim's table."""
        self.config = config
        self.policy = policy
        self.kv = kv
        self.running, self.waiting, self.swapped = running, waiting, swapped
        self.block_tables = block_tables
        self.victim_rule = victim_rule(config.preemption_victim)
        self.num_preemptions = 0
        self.num_preemptions_by_mode = {"swap": 0, "recompute": 0}
        self._last_log = float("-inf")

    def allocate(self, request: Request, num_new: int, out: SchedulerOutput,
                 budget: StepBudget, now: float) -> bool:
        """KV slots for a running request's num_new tokens, preempting the victim rule's
        choice among the running requests until they fit; False if it was the victim."""
        while self.kv.allocate_slots(request, num_new) is None:
            victim = self.victim_rule(self.running, self.policy, now)
            self.preempt(victim, out, budget, now, reason="out of KV blocks")
            if victim is request:
                return False
        return True

    def make_room(self, request: Request, tokens_for: Callable[[int], int], cached: list[int],
                  out: SchedulerOutput, budget: StepBudget, step: int, now: float) -> bool:
        """Active preemption: make room for a waiting request by evicting running ones it
        outranks (each past its minimum quantum at scheduler step `step`), in the victim
        rule's order — but only when the evictions are enough (in KV blocks and max_num_seqs
        seats) to admit it in this very step; otherwise nobody is evicted.
        `tokens_for(extra)`: how many tokens it would compute with `extra` more tokens."""
        if not self.config.active_preemption:
            return False
        eligible = [r for r in self.running
                    if step - r.last_admitted_step >= self.config.min_run_quantum
                    and self.policy.outranks(request, r, now)]
        victims, freed, returned, hits = [], 0, 0, set(cached)
        while eligible:
            victim = self.victim_rule(eligible, self.policy, now)
            eligible.remove(victim)
            victims.append(victim)
            freed += self.kv.num_blocks_freed_by(victim, keep=hits)
            returned += budget.given(victim)
            if (budget.seats_needed(request) <= len(victims)
                    and self.kv.can_allocate(request, tokens_for(returned), cached,
                                             extra_free=freed)):
                break
        else:
            return False
        for victim in victims:
            self.preempt(victim, out, budget, now, reason=f"outranked by {request.request_id}")
        return True

    def preempt(self, victim: Request, out: SchedulerOutput, budget: StepBudget, now: float,
                reason: str) -> None:
        if budget.give_back(victim):  # what it was given this step, drafts included
            out.scheduled_spec_decode_tokens.pop(victim.request_id, None)
        self.running.remove(victim)
        # vLLM V0's rule: swap a sequence whose group lives on, recompute a lone one.
        mode = self.config.preemption_mode or (
            "swap" if sequence_group.num_siblings(victim) else "recompute")
        mapping = self.kv.swap_out(victim) if mode == "swap" and not out.swap_in else None
        if mapping is not None:
            out.swap_out.extend(mapping)
            victim.status = RequestStatus.SWAPPED
            self.swapped.append(victim)
        else:
            mode = "recompute"
            self.kv.free(victim)
            victim.num_computed_tokens = 0
            victim.status = RequestStatus.WAITING
            self.waiting.append(victim)
        self.block_tables.resend(victim.request_id)
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.num_preemptions_by_mode[mode] += 1
        out.preempted_req_ids.append(victim.request_id)
        if now - self._last_log > 5.0:  # rate-limited
            self._last_log = now
            logger.warning(
                "Request %s preempted by %s (%s); total preemptions: %d",
                victim.request_id, mode, reason, self.num_preemptions,
            )
