"""The scheduler: the waiting / running / swapped queues and one step's story. Pure Python; it
emits a SchedulerOutput — plain data and per-step diffs — that the model side executes
(block mappings first, then one forward over the flattened batch), and takes back the
sampled token ids.

Each step (schedule()): requests late for their deadline are shed; running requests go first
(so decodes keep flowing), then swapped ones are swapped back in, then waiting ones are
admitted — all in the policy's order, each computing what the step's budget leaves, with
preemption by recompute or swap where KV blocks or seats run out. After the forward,
update_from_output appends the sampled tokens and finishes the requests they end
(core/stop.py): the engine and the simulator share that rule by sharing the scheduler.

Its parts, each in its own module: the config (scheduler_config.py), the step budget and
the chunked-prefill rules (step_budget.py), speculative drafts (spec_decoding.py), LoRA
admission (lora_admission.py), deadline shedding (deadline_shedding.py), the runner's
block-table diffs (block_table_diffs.py), preemption (preemptor.py; its victim rules and
the recompute tax: preemption.py), the step-time model's use (step_timing.py), the KV cache
(kv_cache.py), and the stats it reports (scheduler_stats.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from minivllm.core import sequence_group
from minivllm.core.block_table_diffs import BlockTableDiffs
from minivllm.core.deadline_shedding import DeadlineShedding
from minivllm.core.draft_proposers import DraftProposer
from minivllm.core.kv_cache import KVCacheManager
from minivllm.core.lora_admission import LoRAAdmission
from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.preemption import RecomputeTax
from minivllm.core.preemptor import Preemptor
from minivllm.core.request import Request, RequestStatus, check_context_length
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.core.scheduler_stats import SchedulerStats
from minivllm.core.spec_decoding import SpecDecoding
from minivllm.core.speculative import SpeculativeConfig
from minivllm.core.step_budget import StepBudget, tokens_left
from minivllm.core.step_timing import StepTiming
from minivllm.core.stop import check_stop


class Scheduler:
    # Leave the waiting queue unranked in a step where no order of it could admit a request
    # (_admission_possible), when the policy can say what ranking would have changed
    # (SchedulingPolicy.unranked): the same decisions, without a sort_key per queued request
    # per step of a saturated server. False: rank it at every step, the reference the tests
    # compare decisions with (tests/core/test_unranked_waiting.py).
    skip_futile_ranking = True

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
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.step_count = 0
        self.kv = KVCacheManager(
            config.num_blocks,
            config.block_size,
            config.enable_prefix_caching,
            config.num_swap_blocks,
        )
        policy.attach(self.kv.num_cached_tokens_probe, config.max_num_batched_tokens,
                      config.block_size)
        self.step_timing = StepTiming(config, policy, self.running, lambda: self.step_count)
        self.step_cost = self.step_timing.cost  # the step-time model (None: not needed)
        self.recompute_tax = RecomputeTax()
        self.spec_decoding = SpecDecoding(SpeculativeConfig.parse(config.speculative_config),
                                          proposer, valid_drafts)
        self.lora = LoRAAdmission(config.max_loras)
        self.deadlines = DeadlineShedding(policy)
        self.block_tables = BlockTableDiffs()
        self.preemptor = Preemptor(config, policy, self.kv, self.running, self.waiting,
                                   self.swapped, self.block_tables)
        self.num_unranked_steps = 0  # steps whose waiting queue went unranked

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
        # Again, though the engine and the simulator asked before any side effect of theirs:
        # a request added here directly (tests, tools) is checked all the same.
        self.check_fits(request.num_prompt_tokens, request.max_tokens,
                        sequence_group.group_size(request))
        request.status = RequestStatus.WAITING
        request.predicted_output_len = self.policy.predictor.predict(request)
        self.requests[request.request_id] = request
        self.lora.received(request)
        self.waiting.append(request)
        self.kv.prefetch_from_disk(request)  # its disk blocks read while it waits
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
        self.block_tables.finished(request.request_id)
        if status is not RequestStatus.FINISHED_ABORTED:
            self.policy.on_finished(request)
        self.policy.on_removed(request)
        self.recompute_tax.forget(request)
        self.deadlines.forget(request)
        self.spec_decoding.finish(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def stats(self) -> SchedulerStats:
        """Queues, KV cache and counters (cumulative) now."""
        kv, tax, spec = self.kv, self.recompute_tax, self.spec_decoding.stats
        preemptions = self.preemptor.num_preemptions_by_mode
        return SchedulerStats(
            num_running=len(self.running), num_waiting=len(self.waiting),
            num_swapped=len(self.swapped), **kv.stats(),
            num_preemptions=self.preemptor.num_preemptions,
            num_preemptions_swap=preemptions["swap"],
            num_preemptions_recompute=preemptions["recompute"],
            num_recomputed_tokens=tax.num_recomputed_tokens,
            num_computed_tokens=tax.num_computed_tokens_total,
            num_requests_shed=self.deadlines.num_requests_shed,
            num_requests_deprioritized=self.deadlines.num_requests_deprioritized,
            spec_num_drafts=spec.num_drafts, spec_num_draft_tokens=spec.num_draft_tokens,
            spec_num_accepted_tokens=spec.num_accepted_tokens,
            spec_num_accepted_tokens_per_pos=tuple(spec.num_accepted_tokens_per_pos),
            max_lora=self.config.max_loras,
            running_lora_adapters=self.lora.by_adapter(self.running),
            waiting_lora_adapters=self.lora.by_adapter(self.waiting),
            lora_requests_received=dict(self.lora.requests_received),
        )

    # ---- one step ---------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        self.step_count += 1
        now = self.clock()
        out = SchedulerOutput(step=self.step_count,
                              want_prompt_hidden=self.policy.predictor.needs_hidden_state)
        budget = StepBudget(self.config, self.kv, self.step_cost,
                            self.running, self.waiting, self.swapped)
        self.policy.on_step(self.running, now)
        for request in self.deadlines.to_shed(self.requests.values(), now):
            self.finish_request(request, RequestStatus.FINISHED_ABORTED)
        self._schedule_running(out, budget, now)
        if not out.swap_out:  # swap-in and swap-out never share a step
            self._schedule_swapped(out, budget, now)
        if not self.swapped and not out.preempted_req_ids:
            self._schedule_waiting(out, budget, now)
        self.block_tables.emit(out, budget.scheduled, self.kv)
        self.spec_decoding.scheduled(out)
        self.step_timing.scheduled(out, self.requests)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: StepBudget, now: float) -> None:
        # Decodes before prefill chunks (a stable sort keeps the policy's order within each),
        # so a long prompt being chunked never holds back running decodes.
        ordered = self.policy.order(self.running, now)
        ordered.sort(key=lambda r: r.num_tokens - r.num_computed_tokens > 1)
        for request in ordered:
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = budget.chunk(request, request.num_computed_tokens)
            if num_new == 0:
                continue
            # Drafts follow a request's last token only (a chunk of one prompt token, the
            # budget's last, is not: it has more prompt to compute).
            decoding = request.num_tokens - request.num_computed_tokens == 1
            if num_new == 1 and decoding and self._speculate(request, out, budget.tokens - 1):
                drafts = out.scheduled_spec_decode_tokens[request.request_id]
                budget.take(request, 1 + len(drafts))
                continue
            if self.preemptor.allocate(request, num_new, out, budget, now):
                budget.take(request, num_new)

    def _speculate(self, request: Request, out: SchedulerOutput, room: int) -> bool:
        """Give a decoding request draft tokens this step, with KV slots for them and its
        last token, when speculation is on for it and the pool has the room without
        preempting anyone (else it decodes one token as usual)."""
        drafts = self.spec_decoding.propose(request, room, len(self.running),
                                            self.config.max_model_len)
        if not drafts or self.kv.allocate_slots(request, 1 + len(drafts)) is None:
            return False
        out.scheduled_spec_decode_tokens[request.request_id] = drafts
        return True

    def _schedule_swapped(self, out: SchedulerOutput, budget: StepBudget, now: float) -> None:
        loras = self.lora.in_use(self.running)
        for request in self.policy.order(self.swapped, now):
            if budget.seats_taken() >= self.config.max_num_seqs or budget.tokens <= 0:
                return
            if self.lora.full(request, loras):
                continue
            num_new = budget.chunk(request, request.num_computed_tokens)
            if num_new == 0 or not budget.swap_in_fits(request, num_new):
                return  # keep the order: nobody overtakes the best swapped request
            out.swap_in.extend(self.kv.swap_in(request))
            self.kv.allocate_slots(request, num_new)
            self.swapped.remove(request)
            self._admit(request, budget, num_new)
            self.lora.admit(request, loras)

    def _admission_possible(self, budget: StepBudget) -> bool:
        """Whether some order of the waiting queue could admit a request this step: tokens
        are left, and a seat and a KV block are free (a waiting request holds no blocks, so
        it needs one), or active preemption has a running request past its minimum quantum
        to evict. When not, the loop below stops at the first request it tries, having
        changed nothing but what ranking changes in the policy."""
        if budget.tokens <= 0:
            return False
        if budget.seats_taken() < self.config.max_num_seqs and self.kv.num_free_blocks > 0:
            return True
        quantum = self.config.min_run_quantum
        return self.config.active_preemption and any(
            self.step_count - r.last_admitted_step >= quantum for r in self.running)

    def _schedule_waiting(self, out: SchedulerOutput, budget: StepBudget, now: float) -> None:
        if (self.skip_futile_ranking and self.waiting and not self._admission_possible(budget)
                and self.policy.unranked(self.waiting, now)):
            self.num_unranked_steps += 1
            return
        loras = self.lora.in_use(self.running)
        for request in self.policy.order(self.waiting, now):
            if budget.tokens <= 0:
                return
            if self.lora.full(request, loras):
                continue  # a request of a running adapter (or none) behind it may go
            cached = self.kv.find_cached_blocks(request) if request.num_computed_tokens == 0 else []
            if self.kv.load_from_disk(request, cached):  # memory misses the disk tier holds
                cached = self.kv.find_cached_blocks(request)
            num_cached = len(cached) * self.config.block_size
            # All but the last prompt token cached (or a one-token prompt): the group forks
            # as soon as the head is admitted, and the head computes that last token.
            fork_now = sequence_group.ready_to_fork(request, num_cached)

            def tokens_for(extra: int = 0, request=request, num_cached=num_cached,
                           fork=fork_now) -> int:
                return 1 if fork else budget.chunk(request, num_cached, extra)

            num_left = tokens_left(request, num_cached)
            if (not fork_now and num_left > 1 and self.config.enable_chunked_prefill
                    and not budget.prefill_seat_free(num_left)):
                continue  # a shorter prompt behind it may still take a seat
            num_new = tokens_for()
            if num_new == 0:
                return
            seats_full = budget.seats_needed(request) > 0
            if seats_full or not self.kv.can_allocate(request, num_new, cached):
                if not self.preemptor.make_room(request, tokens_for, cached, out, budget,
                                                self.step_count, now):
                    return
                num_new = tokens_for()  # the victims gave their tokens back
            allocated = self.kv.allocate_slots(request, num_new, cached)
            assert allocated is not None, "active preemption freed too few blocks"
            if self.config.enable_prefix_caching and not request.needs_prompt_logits:
                self.kv.record_lookup(request.num_tokens, num_cached)
            if request.num_preemptions == 0:
                request.num_cached_tokens = num_cached
            request.num_computed_tokens = num_cached
            self.waiting.remove(request)
            self._admit(request, budget, num_new)
            self.lora.admit(request, loras)
            if fork_now:
                self._fork(request)

    def _admit(self, request: Request, budget: StepBudget, num_new: int) -> None:
        request.status = RequestStatus.RUNNING
        request.last_admitted_step = self.step_count
        if request.first_scheduled_step is None:
            request.first_scheduled_step = self.step_count
            # what the predictor says when the request is admitted: the prediction its
            # admission was ranked by (with what had finished by then), the one scored
            request.predicted_output_len = self.policy.predictor.predict(request)
        self.running.append(request)
        budget.take(request, num_new)

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
                self.spec_decoding.verified(req_id, drafts, num_accepted)
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
                self.block_tables.resend(req_id)
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

    # ---- the step-time model ----------------------------------------------------------

    def record_step_time(self, seconds: float) -> None:
        """How long the step last scheduled took (its forward, as the engine or the
        simulator's cost model timed it): what the step-time models learn from (the
        scheduler's, and speculation's price of a verification row)."""
        self.spec_decoding.step_time(seconds)
        self.step_timing.observe(seconds)
