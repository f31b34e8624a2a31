"""The scheduler: waiting / running / swapped queues, token and sequence budgets, and
preemption by recompute or swap. Pure Python; it emits a SchedulerOutput — plain data and
per-step diffs — that the model side executes (block mappings first, then one forward over
the flattened batch), and takes back the sampled token ids.

Each step: running requests first (so decodes keep flowing), then swapped ones are
swapped back in, then waiting ones are admitted — all in the policy's order. After the
forward, update_from_output appends the sampled tokens and finishes the requests they end
(core/stop.py): the engine and the simulator share that rule by sharing the scheduler.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

from minivllm.core import sequence_group
from minivllm.core.draft_proposers import DRAFT_PLACEHOLDER, DraftProposer, make_proposer
from minivllm.core.kv_cache import KVCacheManager
from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.preemption import RecomputeTax, victim_rule
from minivllm.core.request import Request, RequestStatus, check_context_length
from minivllm.core.scheduler_output import NewRequestData, SchedulerOutput
from minivllm.core.speculative import (
    DraftTracker,
    SpecDecodingStats,
    SpeculativeConfig,
    parse_speculative_config,
)
from minivllm.core.step_batch import StepBatch, step_batch
from minivllm.core.step_cost import OnlineStepCost
from minivllm.core.stop import check_stop

logger = logging.getLogger(__name__)


@dataclass
class SchedulerConfig:
    """The scheduler's KV blocks, step budget, preemption and admission limits. As part of
    the engine's config (config.py) its fields are engine arguments of the same names,
    except num_blocks and num_swap_blocks: the engine sets those from the cache the model
    runner allocated, and max_model_len from the model when it is not given."""

    num_blocks: int = 0
    block_size: int = 16
    max_num_seqs: int = 256
    # Tokens per step. None: 512 with chunked prefill (a step that carries a prefill chunk
    # then costs ~0.3 s on a 135M model here, which bounds how long decodes wait behind it;
    # measured in docs/performance.md), else max(2048, max_model_len).
    max_num_batched_tokens: int | None = 2048
    max_model_len: int | None = 2048  # None: not known yet (the model's, set by the engine)
    num_swap_blocks: int = 0
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    # vLLM's: with chunked prefill, a request computes at most this many tokens a step (0:
    # no cap), so that a long prompt leaves room in each step for the other prompts and the
    # decodes instead of filling the budget alone. As in vLLM, a request alone in the
    # engine is not capped (there is nobody to leave room for); with the adaptive flag the
    # cap is raised to a fair share of the budget, max_num_batched_tokens / requests.
    long_prefill_token_threshold: int = 0
    long_prefill_token_threshold_adaptive: bool = False
    # vLLM V0's: with chunked prefill, at most this many requests compute prompt tokens in
    # one step (None: no limit), and of those at most max_long_partial_prefills have more
    # than long_prefill_token_threshold tokens left to prefill, so short prompts pass
    # long ones waiting behind the ones already prefilling.
    max_num_partial_prefills: int | None = None
    max_long_partial_prefills: int | None = None
    # With chunked prefill, pack each step that carries decodes so its predicted time stays
    # within this (core/step_cost.py learns the prediction from the steps run): a step's
    # time is the TPOT of each of its decodes, and a prefill chunk that would pass the
    # target is cut to what fits, never below one block for the step's first prefill, so
    # prompts still start every step. None: off (steps fill max_num_batched_tokens).
    target_tpot_ms: float | None = None
    preemption_mode: str | None = None  # None: swap multi-sequence requests, else recompute
    active_preemption: bool = False
    min_run_quantum: int = 8  # steps a request runs before it may be actively preempted
    preemption_victim: str = "lowest_rank"  # core/preemption.py's VICTIM_RULES
    # Admission: the engine core turns requests away at these queue bounds, and fails those
    # that waited request_timeout seconds without being scheduled.
    max_num_waiting_requests: int | None = None
    max_num_waiting_tokens: int | None = None
    request_timeout: float | None = None
    # LoRA (--enable-lora): the most adapters the requests of one step may use; a waiting
    # request of another adapter waits until one of the running adapters has no request.
    max_loras: int = 1
    # vLLM's --speculative-config (core/speculative.py): {"method": "ngram",
    # "num_speculative_tokens": 3, ...}; None: no speculative decoding.
    speculative_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{name} {why}, got {getattr(self, name)!r}")

        if self.block_size < 1 or self.block_size > 256:
            raise bad("block_size", "must be in [1, 256]")
        if self.max_num_seqs < 1:
            raise bad("max_num_seqs", "must be >= 1")
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = (512 if self.enable_chunked_prefill
                                           else max(2048, self.max_model_len or 0))
        if self.max_num_batched_tokens < 1:
            raise bad("max_num_batched_tokens", "must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise bad("max_model_len", "must be >= 1")
        if self.long_prefill_token_threshold < 0:
            raise bad("long_prefill_token_threshold", "must be >= 0 (0: no cap)")
        if self.long_prefill_token_threshold and not self.enable_chunked_prefill:
            raise bad("long_prefill_token_threshold", "needs chunked prefill (it caps chunks)")
        if self.long_prefill_token_threshold_adaptive and not self.long_prefill_token_threshold:
            raise bad("long_prefill_token_threshold_adaptive",
                      "needs long_prefill_token_threshold > 0 (it raises that cap)")
        for name in ("max_num_partial_prefills", "max_long_partial_prefills"):
            if getattr(self, name) is None:
                continue
            if getattr(self, name) < 1:
                raise bad(name, "must be >= 1 (None: no limit)")
            if not self.enable_chunked_prefill:
                raise bad(name, "needs chunked prefill (it limits partial prefills)")
        if self.max_long_partial_prefills is not None:
            if not self.long_prefill_token_threshold:
                raise bad("max_long_partial_prefills",
                          "needs long_prefill_token_threshold > 0 (what counts as long)")
            if self.max_long_partial_prefills > (self.max_num_partial_prefills or 1 << 30):
                raise bad("max_long_partial_prefills", "must be <= max_num_partial_prefills")
        if self.target_tpot_ms is not None:
            if not self.target_tpot_ms > 0:
                raise bad("target_tpot_ms", "must be > 0 (None: off)")
            if not self.enable_chunked_prefill:
                raise bad("target_tpot_ms", "needs chunked prefill (it cuts prefill chunks)")
        if self.preemption_mode not in (None, "recompute", "swap"):
            raise bad("preemption_mode", "must be recompute or swap")
        if self.min_run_quantum < 0:
            raise bad("min_run_quantum", "must be >= 0")
        victim_rule(self.preemption_victim)  # a ValueError naming the known rules
        for name in ("max_num_waiting_requests", "max_num_waiting_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise bad(name, "must be >= 1")
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise bad("request_timeout", "must be > 0")
        if self.max_loras < 1:
            raise bad("max_loras", "must be >= 1")
        self.speculative_config = parse_speculative_config(self.speculative_config)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        policy: SchedulingPolicy,
        clock: Callable[[], float] = time.time,
        eos_token_ids: Collection[int] = (),
        proposer: DraftProposer | None = None,
        valid_drafts: Callable[[str, list[int]], int] | None = None,
    ) -> None:
        """`eos_token_ids`: the model's end-of-sequence tokens, which stop a request
        (unless it sets ignore_eos). `proposer(request, k)`: up to k draft tokens for it,
        with speculative_config; default: its method's (core/draft_proposers.py); the
        simulator's drafts come true at a given acceptance rate (sim/replica.py).
        `valid_drafts(request_id, drafts)`: how many leading drafts the request's grammar
        accepts (structured outputs; the engine core's sampler knows the grammars)."""
        self.config = config
        self.policy = policy
        self.clock = clock
        self.eos_token_ids = frozenset(eos_token_ids)
        self.kv = KVCacheManager(
            config.num_blocks,
            config.block_size,
            config.enable_prefix_caching,
            config.num_swap_blocks,
        )
        policy.attach(self.kv.num_cached_tokens_probe, config.max_num_batched_tokens,
                      config.block_size)
        # target_tpot_ms and policies that predict (goodput): the step-time model, and the
        # last step's composition, which record_step_time pairs with the time it took.
        self.step_cost = (OnlineStepCost() if config.target_tpot_ms is not None
                          or policy.needs_step_cost else None)
        self._last_batch: StepBatch | None = None
        if policy.needs_step_cost:
            policy.prefill_seconds = self._prefill_seconds
        self._decodes_at: tuple[int, StepBatch] = (-1, StepBatch())  # _prefill_seconds' cache
        self.victim_rule = victim_rule(config.preemption_victim)
        self.recompute_tax = RecomputeTax()
        # Deadline policies: requests shed (finished for missing their deadline while queued;
        # the engine takes them to report the error) and those ranked last for it.
        self.shed: list[Request] = []
        self.num_requests_shed = 0
        self.num_requests_deprioritized = 0
        self.lora_requests_received: dict[str, int] = {}  # by LoRA adapter name
        self._late: set[str] = set()
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.step_count = 0
        self.num_preemptions = 0
        self.num_preemptions_by_mode = {"swap": 0, "recompute": 0}
        self._last_preemption_log = float("-inf")
        # What the runner holds: request id -> how many of its block ids it has (-1: it must
        # be sent the whole table again), and the ids finished since the last step.
        self._runner_blocks: dict[str, int] = {}
        self._finished_ids: list[str] = []
        # This step, while it is being scheduled: request id -> (request, new tokens).
        self._scheduled: dict[str, tuple[Request, int]] = {}
        # Speculative decoding: its config, each decoding request's acceptance tracker.
        self.spec = SpeculativeConfig.parse(config.speculative_config)
        self.proposer = proposer or (make_proposer(self.spec) if self.spec else None)
        self.valid_drafts = valid_drafts
        self.spec_stats = SpecDecodingStats()
        self._drafts: dict[str, DraftTracker] = {}

    # ---- requests in and out ----------------------------------------------------------

    def check_fits(self, num_prompt_tokens: int, max_tokens: int, num_seqs: int = 1) -> None:
        """Reject a request that could never be served, naming the numbers."""
        check_context_length(num_prompt_tokens, max_tokens, self.config.max_model_len)
        total = num_prompt_tokens + max_tokens
        if num_seqs > self.config.max_num_seqs:
            raise ValueError(f"n ({num_seqs} sequences) exceeds max_num_seqs="
                             f"{self.config.max_num_seqs}")
        capacity = self.config.num_blocks * self.config.block_size
        if total > capacity:
            raise ValueError(
                f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) = {total} "
                f"exceeds the whole KV cache ({capacity} tokens)"
            )
        budget = self.config.max_num_batched_tokens
        if not self.config.enable_chunked_prefill and total > budget:
            raise ValueError(  # it could never be computed (or recomputed) in one step
                f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) = {total} "
                f"exceeds max_num_batched_tokens={budget} with chunked prefill disabled"
            )

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        self.check_fits(request.num_prompt_tokens, request.max_tokens,
                        sequence_group.group_size(request))
        request.status = RequestStatus.WAITING
        request.predicted_output_len = self.policy.predictor.predict(request)
        self.requests[request.request_id] = request
        lora = request.core_request.lora_request
        if lora is not None:
            self.lora_requests_received[lora.lora_name] = \
                self.lora_requests_received.get(lora.lora_name, 0) + 1
        self.waiting.append(request)
        self.policy.on_arrival(request, self.clock())

    def finish_request(self, request: Request, status: RequestStatus) -> None:
        """Take a request out of whichever queue holds it and release all its blocks."""
        assert status.finished
        if request.is_finished:
            return
        for queue in (self.running, self.waiting, self.swapped):
            if request in queue:
                queue.remove(request)
        self.kv.free(request)
        self.kv.free_swapped(request)
        request.status = status
        sequence_group.finished(request)
        self.requests.pop(request.request_id, None)
        if self._runner_blocks.pop(request.request_id, None) is not None:
            self._finished_ids.append(request.request_id)
        if status is not RequestStatus.FINISHED_ABORTED:
            self.policy.on_finished(request)
        self.policy.on_removed(request)
        self.recompute_tax.forget(request)
        self._late.discard(request.request_id)
        self._drafts.pop(request.request_id, None)
        if self.proposer is not None:
            self.proposer.finish(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def stats(self) -> dict[str, int | float]:
        """Queues, KV cache and counters (cumulative) now, by engine/stats.py's
        SchedulerStats field names."""
        kv, tax = self.kv, self.recompute_tax
        return dict(
            num_running=len(self.running), num_waiting=len(self.waiting),
            num_swapped=len(self.swapped), num_total_blocks=kv.num_blocks,
            num_free_blocks=kv.num_free_blocks, kv_cache_usage=kv.usage,
            num_total_swap_blocks=kv.num_swap_blocks,
            num_free_swap_blocks=len(kv.free_swap_blocks),
            num_preemptions=self.num_preemptions,
            prefix_cache_queries=kv.prefix_cache_queries, prefix_cache_hits=kv.prefix_cache_hits,
            num_recomputed_tokens=tax.num_recomputed_tokens,
            num_computed_tokens=tax.num_computed_tokens_total,
            num_requests_shed=self.num_requests_shed,
            num_requests_deprioritized=self.num_requests_deprioritized,
            spec_num_drafts=self.spec_stats.num_drafts,
            spec_num_draft_tokens=self.spec_stats.num_draft_tokens,
            spec_num_accepted_tokens=self.spec_stats.num_accepted_tokens,
            spec_num_accepted_tokens_per_pos=tuple(self.spec_stats.num_accepted_tokens_per_pos),
            **self._lora_stats(),
        )

    def _lora_stats(self) -> dict:
        """Requests by LoRA adapter name (the queues are walked only once a request named
        an adapter)."""
        if not self.lora_requests_received:
            return dict(max_lora=self.config.max_loras, running_lora_adapters={},
                        waiting_lora_adapters={}, lora_requests_received={})

        def by_adapter(queue) -> dict[str, int]:
            counts: dict[str, int] = {}
            for r in queue:
                if r.core_request.lora_request is not None:
                    name = r.core_request.lora_request.lora_name
                    counts[name] = counts.get(name, 0) + 1
            return counts

        return dict(max_lora=self.config.max_loras,
                    running_lora_adapters=by_adapter(self.running),
                    waiting_lora_adapters=by_adapter(self.waiting),
                    lora_requests_received=dict(self.lora_requests_received))

    # ---- one step ---------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        self.step_count += 1
        now = self.clock()
        out = SchedulerOutput(step=self.step_count,
                              want_prompt_hidden=self.policy.predictor.needs_hidden_state)
        self._scheduled = {}
        self._prefills = [0, 0]  # requests computing prompt tokens this step: all, long
        budget = [self.config.max_num_batched_tokens]
        self.policy.on_step(self.running, now)
        self._handle_late(now)
        self._schedule_running(out, budget, now)
        if not out.swap_out:  # swap-in and swap-out never share a step
            self._schedule_swapped(out, budget, now)
        if not self.swapped and not out.preempted_req_ids:
            self._schedule_waiting(out, budget, now)
        self._emit(out)
        if self.step_cost is not None:
            self._last_batch = step_batch(out, self.requests, self.config.block_size)
        return out

    def record_step_time(self, seconds: float) -> None:
        """How long the step last scheduled took (its forward, as the engine or the
        simulator's cost model timed it): what the step-time model learns from."""
        if self.step_cost is not None and self._last_batch is not None:
            self.step_cost.observe(self._last_batch, seconds)
            self._last_batch = None

    def _handle_late(self, now: float) -> None:
        """Requests the policy finds past their deadline: shed if queued and the policy sheds
        (they free their place for requests that can still make theirs), else counted once
        as deprioritized (the policy ranks them last)."""
        for request in self.policy.late_requests(self.requests.values(), now):
            if self.policy.shed_late and request.status is not RequestStatus.RUNNING:
                self.finish_request(request, RequestStatus.FINISHED_ABORTED)
                self.shed.append(request)
                self.num_requests_shed += 1
            elif request.request_id not in self._late:
                self._late.add(request.request_id)
                self.num_requests_deprioritized += 1

    def take_shed(self) -> list[Request]:
        shed, self.shed = self.shed, []
        return shed

    def _emit(self, out: SchedulerOutput) -> None:
        """Turn this step's decisions into data: new requests in full, the others as diffs."""
        copied = self.kv.pending_copies  # destinations of this step's copy-on-write copies
        for req_id, (request, num_new) in self._scheduled.items():
            out.num_scheduled_tokens[req_id] = num_new
            known = self._runner_blocks.get(req_id)
            if known is None:
                out.scheduled_new_reqs.append(NewRequestData(
                    req_id, request.prompt_token_ids, list(request.output_token_ids),
                    list(request.block_ids), request.num_computed_tokens,
                    request.sampling_params, request.seed, request.banned_until_min_tokens,
                    request.core_request.lora_int_id, request.core_request.pooling_params))
            else:
                # A copy-on-write replaced its last block of the previous step (with draft
                # tokens, blocks may have been appended after it).
                replace = known < 0 or bool(copied and any(
                    b in copied for b in request.block_ids[max(known - 1, 0):]))
                out.scheduled_cached_reqs.append(
                    req_id, request.num_computed_tokens,
                    list(request.block_ids) if replace else request.block_ids[known:], replace)
            self._runner_blocks[req_id] = len(request.block_ids)
        out.copies = self.kv.take_pending_copies()
        out.finished_req_ids, self._finished_ids = self._finished_ids, []

    def _chunk(self, request: Request, computed: int, budget: int) -> int:
        """How many of the request's uncomputed tokens fit this step's token budget (0 where
        the step's partial prefills are full, see _prefill_seat_free)."""
        num_new = self._tokens_left(request, computed)
        if not self.config.enable_chunked_prefill:
            return num_new if num_new <= budget else 0
        if num_new > 1 and not self._prefill_seat_free(num_new):
            return 0
        num_new = min(num_new, budget, self._prefill_cap())
        return self._fit_step_time(num_new, computed) if num_new > 1 else num_new

    def _prefill_seconds(self, num_tokens: int) -> float | None:
        """Predicted seconds to prefill num_tokens prompt tokens in steps beside the running
        decodes (each step: the decodes and a budget's worth of prompt), None before the
        step-time model is ready."""
        if not self.step_cost.ready:
            return None
        if self._decodes_at[0] != self.step_count:  # the running decodes, once a step
            decodes = StepBatch()
            for request in self.running:
                if request.num_tokens - request.num_computed_tokens <= 1:
                    decodes.add(1, request.num_computed_tokens)
            self._decodes_at = (self.step_count, decodes)
        decodes = self._decodes_at[1]
        chunk = max(2, self.config.max_num_batched_tokens - decodes.num_decode_seqs)
        # The step that computes a prompt's last token is full whenever more prompts wait
        # behind it, so every step counts whole, but for a prefill that fits one step.
        steps = -(-num_tokens // chunk)
        batch = replace(decodes)
        batch.add(max(2, min(num_tokens, chunk)), 0)  # (one token would count as a decode)
        return steps * self.step_cost.step_time(batch)

    def _fit_step_time(self, num_new: int, computed: int) -> int:
        """target_tpot_ms: at most the tokens of a prefill chunk that keep the step's
        predicted time within the target, where the step carries decodes; the step's first
        prefill gets at least a block."""
        if self.config.target_tpot_ms is None or not self.step_cost.ready:
            return num_new
        batch = StepBatch()
        for request, n in self._scheduled.values():
            batch.add(n, request.num_computed_tokens)
        if batch.num_decode_seqs == 0:
            return num_new  # no decode waits for this step: the prompt takes the budget
        fits = self.step_cost.max_prefill_tokens(batch, computed, num_new,
                                                 self.config.target_tpot_ms / 1e3)
        floor = min(num_new, self.config.block_size) if self._prefills[0] == 0 else 0
        return max(fits, floor)

    @staticmethod
    def _tokens_left(request: Request, computed: int) -> int:
        """Tokens the request has to compute from `computed` on: more than one while it
        prefills (its prompt, or after a recompute preemption its prompt and output)."""
        num_left = request.num_tokens - computed
        return num_left - 1 if sequence_group.holds_back_last_token(request) else num_left

    def _prefill_cap(self) -> int:
        """long_prefill_token_threshold as vLLM applies it: off for a request alone, raised
        to a fair share of the budget when adaptive."""
        cap = self.config.long_prefill_token_threshold
        num_requests = len(self.running) + len(self.waiting) + len(self.swapped)
        if not cap or num_requests <= 1:
            return 1 << 62
        if self.config.long_prefill_token_threshold_adaptive:
            cap = max(cap, self.config.max_num_batched_tokens // num_requests)
        return cap

    def _is_long(self, num_left: int) -> bool:
        return num_left > self.config.long_prefill_token_threshold > 0

    def _prefill_seat_free(self, num_left: int) -> bool:
        """A request with num_left prompt tokens to compute may prefill this step unless
        max_num_partial_prefills requests already do, or it is long and
        max_long_partial_prefills long ones do."""
        limit, long_limit = (self.config.max_num_partial_prefills,
                             self.config.max_long_partial_prefills)
        if limit is not None and self._prefills[0] >= limit:
            return False
        return not (self._is_long(num_left) and long_limit is not None
                    and self._prefills[1] >= long_limit)

    def _schedule(self, request: Request, num_new: int, budget: list[int]) -> None:
        """The request computes num_new tokens this step (counted as a partial prefill if
        it is prefilling)."""
        self._count_prefill(request, +1)
        self._scheduled[request.request_id] = (request, num_new)
        budget[0] -= num_new

    def _count_prefill(self, request: Request, sign: int) -> None:
        num_left = self._tokens_left(request, request.num_computed_tokens)
        if num_left > 1:
            self._prefills[0] += sign
            self._prefills[1] += sign * self._is_long(num_left)

    def _schedule_running(self, out: SchedulerOutput, budget: list[int], now: float) -> None:
        # Decodes before prefill chunks (a stable sort keeps the policy's order within each),
        # so a long prompt being chunked never holds back running decodes.
        ordered = self.policy.order(self.running, now)
        ordered.sort(key=lambda r: r.num_tokens - r.num_computed_tokens > 1)
        for request in ordered:
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = self._chunk(request, request.num_computed_tokens, budget[0])
            if num_new == 0:
                continue
            if num_new == 1 and self._speculate(request, out, budget[0] - 1):
                self._schedule(request, 1 + len(out.scheduled_spec_decode_tokens[
                    request.request_id]), budget)
                continue
            while self.kv.allocate_slots(request, num_new) is None:
                victim = self.victim_rule(self.running, self.policy, now)
                self._preempt(victim, out, budget, now, reason="out of KV blocks")
                if victim is request:
                    break
            if request.status is RequestStatus.RUNNING:
                self._schedule(request, num_new, budget)

    def _speculate(self, request: Request, out: SchedulerOutput, room: int) -> bool:
        """Give a decoding request draft tokens this step, with KV slots for them and its
        last token, when speculation is on for it and the pool has the room without
        preempting anyone (else it decodes one token as usual)."""
        spec = self.spec
        if spec is None or (spec.disable_by_batch_size is not None
                            and len(self.running) > spec.disable_by_batch_size):
            return False
        tracker = self._drafts.setdefault(request.request_id, DraftTracker())
        # A draft never runs past max_tokens or the context: the target adds one token more.
        k = min(tracker.draft_length(spec), room,
                request.max_tokens - request.num_output_tokens - 1,
                self.config.max_model_len - request.num_tokens - 1)
        drafts = self.proposer(request, k) if k > 0 else []
        if drafts and self.valid_drafts is not None and drafts[0] != DRAFT_PLACEHOLDER:
            drafts = drafts[:self.valid_drafts(request.request_id, drafts)]
        if not drafts or self.kv.allocate_slots(request, 1 + len(drafts)) is None:
            return False
        out.scheduled_spec_decode_tokens[request.request_id] = drafts
        return True

    def _loras_running(self) -> set[int]:
        return {r.core_request.lora_int_id for r in self.running} - {0}

    def _lora_full(self, request: Request, loras: set[int]) -> bool:
        """max_loras: a request of an adapter no running request uses waits while the running
        requests already use max_loras adapters."""
        lora_id = request.core_request.lora_int_id
        return bool(lora_id) and lora_id not in loras and len(loras) >= self.config.max_loras

    def _schedule_swapped(self, out: SchedulerOutput, budget: list[int], now: float) -> None:
        loras = self._loras_running()
        for request in self.policy.order(self.swapped, now):
            if self._seats_taken() >= self.config.max_num_seqs or budget[0] <= 0:
                return
            if self._lora_full(request, loras):
                continue
            num_new = self._chunk(request, request.num_computed_tokens, budget[0])
            # It may hold more blocks than it needs: those allocated in the step it was
            # preempted, for a chunk it then gave back.
            tokens_after = request.num_computed_tokens + num_new
            blocks = max(len(request.swap_block_ids), self.kv.blocks_needed(tokens_after))
            if num_new == 0 or blocks > self.kv.num_free_blocks:
                return  # keep the order: nobody overtakes the best swapped request
            out.swap_in.extend(self.kv.swap_in(request))
            self.kv.allocate_slots(request, num_new)
            self.swapped.remove(request)
            self._admit(request, budget, num_new)
            if request.core_request.lora_int_id:
                loras.add(request.core_request.lora_int_id)

    def _schedule_waiting(self, out: SchedulerOutput, budget: list[int], now: float) -> None:
        loras = self._loras_running()
        for request in self.policy.order(self.waiting, now):
            if budget[0] <= 0:
                return
            if self._lora_full(request, loras):
                continue  # a request of a running adapter (or none) behind it may go
            cached = self.kv.find_cached_blocks(request) if request.num_computed_tokens == 0 else []
            num_cached = len(cached) * self.config.block_size
            # All but the last prompt token cached (or a one-token prompt): the group forks
            # as soon as the head is admitted, and the head computes that last token.
            fork_now = sequence_group.ready_to_fork(request, num_cached)

            def tokens_for(budget: int, request=request, num_cached=num_cached, fork=fork_now):
                return 1 if fork else self._chunk(request, num_cached, budget)

            num_left = self._tokens_left(request, num_cached)
            if (not fork_now and num_left > 1 and self.config.enable_chunked_prefill
                    and not self._prefill_seat_free(num_left)):
                continue  # a shorter prompt behind it may still take a seat
            num_new = tokens_for(budget[0])
            if num_new == 0:
                return
            seats_full = self._seats_needed(request) > 0
            if seats_full or not self.kv.can_allocate(request, num_new, cached):
                if not self._preempt_for(request, tokens_for, cached, out, budget, now):
                    return
                num_new = tokens_for(budget[0])  # the victims gave their tokens back
            allocated = self.kv.allocate_slots(request, num_new, cached)
            assert allocated is not None, "active preemption freed too few blocks"
            if self.config.enable_prefix_caching and not request.needs_prompt_logits:
                self.kv.record_lookup(request.num_tokens, num_cached)
            if request.num_preemptions == 0:
                request.num_cached_tokens = num_cached
            request.num_computed_tokens = num_cached
            self.waiting.remove(request)
            self._admit(request, budget, num_new)
            if request.core_request.lora_int_id:
                loras.add(request.core_request.lora_int_id)
            if fork_now:
                self._fork(request)

    def _seats_needed(self, request: Request) -> int:
        """Running seats missing to admit the request with the siblings it will fork."""
        seats = sequence_group.num_seats(request)
        return self._seats_taken() + seats - self.config.max_num_seqs

    def _seats_taken(self) -> int:
        """Running sequences, and the siblings their heads will fork (seats kept for them)."""
        return sum(sequence_group.num_seats(r) for r in self.running)

    def _admit(self, request: Request, budget: list[int], num_new: int) -> None:
        request.status = RequestStatus.RUNNING
        request.last_admitted_step = self.step_count
        if request.first_scheduled_step is None:
            request.first_scheduled_step = self.step_count
            # what the predictor says when the request is admitted: the prediction its
            # admission was ranked by (with what had finished by then), the one scored
            request.predicted_output_len = self.policy.predictor.predict(request)
        self.running.append(request)
        self._schedule(request, num_new, budget)

    # ---- preemption -------------------------------------------------------------------

    def _preempt_for(self, request: Request, tokens_for: Callable[[int], int],
                     cached: list[int], out: SchedulerOutput, budget: list[int],
                     now: float) -> bool:
        """Active preemption: make room for a waiting request by evicting running ones it
        outranks (each past its minimum quantum), in the victim rule's order — but only when
        the evictions are enough (in KV blocks and max_num_seqs seats) to admit it in this
        very step; otherwise nobody is evicted.
        `tokens_for(budget)`: how many tokens it would compute with that budget."""
        if not self.config.active_preemption:
            return False
        eligible = [r for r in self.running
                    if self.step_count - r.last_admitted_step >= self.config.min_run_quantum
                    and self.policy.outranks(request, r, now)]
        victims, freed, returned, hits = [], 0, 0, set(cached)
        while eligible:
            victim = self.victim_rule(eligible, self.policy, now)
            eligible.remove(victim)
            victims.append(victim)
            freed += self.kv.num_blocks_freed_by(victim, keep=hits)
            returned += self._scheduled.get(victim.request_id, (None, 0))[1]
            if (self._seats_needed(request) <= len(victims)
                    and self.kv.can_allocate(request, tokens_for(budget[0] + returned), cached,
                                             extra_free=freed)):
                break
        else:
            return False
        for victim in victims:
            self._preempt(victim, out, budget, now, reason=f"outranked by {request.request_id}")
        return True

    def _preempt(
        self, victim: Request, out: SchedulerOutput, budget: list[int], now: float, reason: str
    ) -> None:
        given = self._scheduled.pop(victim.request_id, None)
        if given is not None:  # it gives back what it was given this step
            budget[0] += given[1]
            self._count_prefill(victim, -1)
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
        if victim.request_id in self._runner_blocks:
            self._runner_blocks[victim.request_id] = -1  # its table will be sent whole
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.num_preemptions_by_mode[mode] += 1
        out.preempted_req_ids.append(victim.request_id)
        if now - self._last_preemption_log > 5.0:  # rate-limited
            self._last_preemption_log = now
            logger.warning(
                "Request %s preempted by %s (%s); total preemptions: %d",
                victim.request_id, mode, reason, self.num_preemptions,
            )

    # ---- after the forward ------------------------------------------------------------

    def update_from_output(self, out: SchedulerOutput,
                           sampled_token_ids: dict[str, int | list[int]],
                           prompt_hidden: dict | None = None) -> list[Request]:
        """Advance computed counts, append the sampled tokens and finish the requests whose
        token ends them (check_stop: their status says why, their blocks are freed); return
        the requests that got new tokens, in the step's order (request.num_new_tokens: how
        many) and the pooling requests whose prompt was completed (none: they end there).
        `sampled_token_ids`: request id -> its token, or with draft tokens the accepted
        drafts and the target's next token (a rejected draft's KV is overwritten: the
        computed count goes back past it, and blocks only the rejected drafts needed are
        freed). `prompt_hidden`: request id -> the last prompt token's hidden state, for
        requests whose prefill completed (out.want_prompt_hidden); the predictor predicts
        again with it."""
        predictor = self.policy.predictor
        for req_id, row in (prompt_hidden or {}).items():
            request = self.requests.get(req_id)
            if request is not None and request.prompt_hidden is None:
                request.prompt_hidden = row
                request.predicted_output_len = predictor.predict(request)
        sampled, stopped = [], {}
        for req_id, num_new in out.num_scheduled_tokens.items():
            request = self.requests.get(req_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue
            tokens = sampled_token_ids.get(req_id, [])
            tokens = [tokens] if isinstance(tokens, int) else tokens
            drafts = out.scheduled_spec_decode_tokens.get(req_id)
            if drafts:
                num_accepted = len(tokens) - 1
                num_new -= len(drafts) - num_accepted
                self.spec_stats.observe(len(drafts), num_accepted)
                self._drafts[req_id].record(len(drafts), num_accepted)
            self.recompute_tax.count(request, num_new)
            request.num_computed_tokens += num_new
            request.num_new_tokens = 0
            for token in tokens:  # up to the one that stops it: check_stop reads the last
                request.append_output_token(token)
                request.num_new_tokens += 1
                status = check_stop(request, self.config.max_model_len, self.eos_token_ids)
                if status is not None:
                    stopped[req_id] = status
                    break
            if tokens:
                sampled.append(request)
            elif request.is_pooling and request.num_computed_tokens == request.num_prompt_tokens:
                # Its prompt is computed: the runner pooled it this step, and it is done.
                stopped[req_id] = RequestStatus.FINISHED_STOPPED
                sampled.append(request)
            if drafts and self.kv.free_tail(request, request.num_computed_tokens + 1):
                self._runner_blocks[req_id] = -1  # its table will be sent whole
            self.kv.cache_full_blocks(request)
            if sequence_group.ready_to_fork(request, request.num_computed_tokens):
                self._fork(request)
        for request in sampled:  # then finish the ones stopped, in the step's order
            if request.request_id in stopped:
                self.finish_request(request, stopped[request.request_id])
        return sampled

    def _fork(self, parent: Request) -> None:
        """Start the parent's pending siblings (core/sequence_group.py) and run them."""
        for child in sequence_group.fork(parent, self.kv, self.step_count):
            self.recompute_tax.forked(parent, child)
            child.status = RequestStatus.RUNNING
            self.requests[child.request_id] = child
            self.running.append(child)
