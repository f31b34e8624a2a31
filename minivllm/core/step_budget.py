"""StepBudget: what is left of one step while the scheduler fills it (mini-sglang's
PrefillAdder plays this part there), and what the step was given so far. The scheduler makes
one per step and asks it how many tokens a request may compute now:

- tokens: max_num_batched_tokens, less what each scheduled request computes;
- seats: max_num_seqs running sequences, a group's head keeping seats for the siblings it
  will fork;
- partial prefills (with chunked prefill): at most max_num_partial_prefills requests compute
  prompt tokens in one step, of those at most max_long_partial_prefills long ones, and
  (long_prefill_token_threshold) each at most that many tokens;
- time (target_tpot_ms): a prefill chunk beside decodes is cut to what keeps the step's
  predicted time (core/step_cost.py) within the target;
- blocks: the KV pool's own free blocks (core/kv_cache.py), which the budget reads.
"""

from __future__ import annotations

from minivllm.core import sequence_group
from minivllm.core.kv_cache import KVCacheManager
from minivllm.core.request import Request
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.step_batch import StepBatch
from minivllm.core.step_cost import OnlineStepCost


def tokens_left(request: Request, computed: int) -> int:
    """Tokens the request has to compute from `computed` on: more than one while it
    prefills (its prompt, or after a recompute preemption its prompt and output)."""
    num_left = request.num_tokens - computed
    return num_left - 1 if sequence_group.holds_back_last_token(request) else num_left


class StepBudget:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager,
                 step_cost: OnlineStepCost | None,
                 running: list[Request], waiting: list[Request], swapped: list[Request]) -> None:
        """`running`, `waiting`, `swapped`: the scheduler's queues, read as they change
        within the step (seats, and the requests a prefill cap shares the step with)."""
        self.config = config
        self.kv = kv
        self.step_cost = step_cost
        self.queues = (running, waiting, swapped)
        self.tokens = config.max_num_batched_tokens
        # Request id -> (request, tokens it computes this step), in the order given.
        self.scheduled: dict[str, tuple[Request, int]] = {}
        self.num_prefills = 0  # of those, requests computing prompt tokens
        self.num_long_prefills = 0  # of those, ones with more than the threshold left

    # ---- what the step is given -------------------------------------------------------

    def take(self, request: Request, num_new: int) -> None:
        """The request computes num_new tokens this step (counted as a partial prefill if
        it is prefilling)."""
        self._count_prefill(request, +1)
        self.scheduled[request.request_id] = (request, num_new)
        self.tokens -= num_new

    def give_back(self, request: Request) -> bool:
        """A preempted request gives back what it was given this step (False: nothing)."""
        given = self.scheduled.pop(request.request_id, None)
        if given is None:
            return False
        self.tokens += given[1]
        self._count_prefill(request, -1)
        return True

    def given(self, request: Request) -> int:
        return self.scheduled.get(request.request_id, (None, 0))[1]

    def _count_prefill(self, request: Request, sign: int) -> None:
        num_left = tokens_left(request, request.num_computed_tokens)
        if num_left > 1:
            self.num_prefills += sign
            self.num_long_prefills += sign * self._is_long(num_left)

    # ---- seats and blocks -------------------------------------------------------------

    def seats_taken(self) -> int:
        """Running sequences, and the siblings their heads will fork (seats kept for them)."""
        return sum(sequence_group.num_seats(r) for r in self.queues[0])

    def seats_needed(self, request: Request) -> int:
        """Running seats missing to admit the request with the siblings it will fork."""
        return self.seats_taken() + sequence_group.num_seats(request) - self.config.max_num_seqs

    def swap_in_fits(self, request: Request, num_new: int) -> bool:
        """The swapped request's blocks, and those its chunk needs, are free. It may hold
        more than it needs: those allocated in the step it was preempted, for a chunk it
        then gave back."""
        tokens_after = request.num_computed_tokens + num_new
        blocks = max(len(request.swap_block_ids), self.kv.blocks_needed(tokens_after))
        return blocks <= self.kv.num_free_blocks

    # ---- how many tokens a request computes -------------------------------------------

    def chunk(self, request: Request, computed: int, extra: int = 0) -> int:
        """How many of the request's uncomputed tokens fit the step's tokens (with `extra`
        more: those preemptions would give back), 0 where the partial prefills are full."""
        budget = self.tokens + extra
        num_new = tokens_left(request, computed)
        if not self.config.enable_chunked_prefill:
            return num_new if num_new <= budget else 0
        if num_new > 1 and not self.prefill_seat_free(num_new):
            return 0
        num_new = min(num_new, budget, self._prefill_cap())
        return self._fit_time(num_new, computed) if num_new > 1 else num_new

    def prefill_seat_free(self, num_left: int) -> bool:
        """A request with num_left prompt tokens to compute may prefill this step unless
        max_num_partial_prefills requests already do, or it is long and
        max_long_partial_prefills long ones do."""
        limit, long_limit = (self.config.max_num_partial_prefills,
                             self.config.max_long_partial_prefills)
        if limit is not None and self.num_prefills >= limit:
            return False
        return not (self._is_long(num_left) and long_limit is not None
                    and self.num_long_prefills >= long_limit)

    def _is_long(self, num_left: int) -> bool:
        return num_left > self.config.long_prefill_token_threshold > 0

    def _prefill_cap(self) -> int:
        """long_prefill_token_threshold as vLLM applies it: off for a request alone, raised
        to a fair share of the budget when adaptive."""
        cap = self.config.long_prefill_token_threshold
        num_requests = sum(len(queue) for queue in self.queues)
        if not cap or num_requests <= 1:
            return 1 << 62
        if self.config.long_prefill_token_threshold_adaptive:
            cap = max(cap, self.config.max_num_batched_tokens // num_requests)
        return cap

    def _fit_time(self, num_new: int, computed: int) -> int:
        """target_tpot_ms: at most the tokens of a prefill chunk that keep the step's
        predicted time within the target, where the step carries decodes; the step's first
        prefill gets at least a block."""
        if self.config.target_tpot_ms is None or not self.step_cost.ready:
            return num_new
        batch = StepBatch()
        for request, n in self.scheduled.values():
            batch.add(n, request.num_computed_tokens)
        if batch.num_decode_seqs == 0:
            return num_new  # no decode waits for this step: the prompt takes the budget
        fits = self.step_cost.max_prefill_tokens(batch, computed, num_new,
                                                 self.config.target_tpot_ms / 1e3)
        floor = min(num_new, self.config.block_size) if self.num_prefills == 0 else 0
        return max(fits, floor)
