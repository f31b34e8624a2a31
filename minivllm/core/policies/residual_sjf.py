"""`residual_sjf`: shortest residual prefill first (vLLM PR #51375's residual-aware SJF): a
queued request ranks by the prefill it still has to compute here — its tokens (the prompt,
and after a recompute preemption the output too) less those computed or in the prefix cache,
in KV blocks, so a cache-warm long prompt counts as
short — ties by arrival. Requests preempted earlier (recovery) go first, in arrival order;
then any request queued `residual_sjf_max_wait_ms` or more, oldest first (0: FCFS for all).
No output-length prediction: it ranks by what is known.

Running requests have one token left once decoding: they rank first, and the victim when
memory runs out is the one with the most prefill left.
"""

from __future__ import annotations

from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.request import Request, RequestStatus


class ResidualPrefillSJFPolicy(SchedulingPolicy):
    name = "residual_sjf"
    uses_length_predictor = False
    option_names = ("residual_sjf_max_wait_ms",)

    def __init__(self, aging_s: float = 10.0, predictor=None,
                 residual_sjf_max_wait_ms: float = 10000.0) -> None:
        super().__init__(aging_s, predictor)
        self.validate_options(residual_sjf_max_wait_ms)
        self.max_wait_s = residual_sjf_max_wait_ms / 1e3

    @classmethod
    def validate_options(cls, residual_sjf_max_wait_ms=10000.0) -> None:
        if not residual_sjf_max_wait_ms >= 0:
            raise ValueError("residual_sjf_max_wait_ms (--residual-sjf-max-wait-ms) must be "
                             f">= 0 (0: FCFS), got {residual_sjf_max_wait_ms!r}")

    def residual_blocks(self, request: Request) -> int:
        """Blocks of tokens left to compute before it decodes: its prompt, and after a
        recompute preemption its output too; 1 token (a block) for a decoding request."""
        computed = request.num_computed_tokens
        if request.status is not RequestStatus.RUNNING:
            cached = self.cached_tokens(request)
            computed = cached if cached > computed else computed  # max(), without the call
        left = len(request.all_token_ids) - computed
        return -(-(left if left > 1 else 1) // self.block_size)

    def sort_key(self, request: Request, now: float) -> tuple:
        if request.num_preemptions:  # also once resumed: else it would preempt its preemptor
            return (0, request.arrival_time, request.request_id)
        age = now - request.arrival_time  # self.age, inlined (hot: every queued request, every step)
        if (age if age > 0.0 else 0.0) >= self.max_wait_s:
            return (1, request.arrival_time, request.request_id)
        return (2, self.residual_blocks(request), request.arrival_time, request.request_id)

    def unranked(self, requests: list[Request], now: float) -> bool:
        return True  # sort_key only reads
