"""`mlfq`: FastServe's skip-join multi-level feedback queue (Wu et al., 2023).

Level k has a quantum of `mlfq_base_quantum * 2**k` decode iterations (lower levels run first).
Skip-join: a new request enters the first level whose quantum covers its first iteration --
its prefill, which takes ceil(uncached prompt tokens / the step's token budget) steps -- so a
long prompt never sits at the top. It is demoted one level each time its service at a level
(its prefill's steps, which make the first token, then one per token) uses up that level's
quantum. Within a level it is first come, first served; a request preempts only across levels (with active preemption), so
two requests of one level never take turns at the cost of a recompute.

Aging keeps it starvation-free: every `aging_s` seconds since arrival lift a request one level
(its effective level), so a long job under a stream of short ones reaches the top level in
(level x aging_s) seconds, where it is the oldest.
"""

from __future__ import annotations

import math

from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.request import Request

NUM_LEVELS = 12  # quanta base .. base * 2**11 iterations; lower levels keep the last


class MultiLevelFeedbackQueuePolicy(SchedulingPolicy):
    name = "mlfq"
    uses_length_predictor = False
    option_names = ("mlfq_base_quantum",)

    def __init__(self, aging_s: float = 10.0, predictor=None, mlfq_base_quantum: int = 4) -> None:
        super().__init__(aging_s, predictor)
        self.validate_options(mlfq_base_quantum=mlfq_base_quantum)
        self.base_quantum = mlfq_base_quantum
        # request -> [level, its service when it entered that level, its prefill iterations]
        # (a plain dict, emptied by on_removed: sort_key reads it for every queued request
        # at every step, and a WeakKeyDictionary's lookups cost several times more)
        self._levels: dict[Request, list[int]] = {}

    @classmethod
    def validate_options(cls, mlfq_base_quantum: int = 4) -> None:
        if mlfq_base_quantum < 1:
            raise ValueError(f"mlfq_base_quantum must be >= 1, got {mlfq_base_quantum!r}")

    def quantum(self, level: int) -> int:
        return self.base_quantum << level

    def level(self, request: Request) -> int:
        state = self._levels.get(request)
        if state is None:  # skip-join: the first level whose quantum covers the prefill
            uncached = max(1, request.num_prompt_tokens - self.cached_tokens(request))
            prefill = math.ceil(uncached / self.token_budget)
            level = next((k for k in range(NUM_LEVELS) if self.quantum(k) >= prefill),
                         NUM_LEVELS - 1)
            state = self._levels[request] = [level, 0, prefill]
        # Iterations of service so far: its prefill's once admitted (they make the first
        # token), then one per token after the first. (Read directly, quantum() inlined:
        # sort_key asks for every queued request at every step, the simulator's hot spot.)
        admitted, outputs = request.first_scheduled_step is not None, len(request.output_token_ids)
        service = state[2] * admitted + (outputs - 1 if outputs > 1 else 0)
        while state[0] < NUM_LEVELS - 1 and service - state[1] >= self.base_quantum << state[0]:
            state[1] += self.base_quantum << state[0]  # demoted: its quantum here is used up
            state[0] += 1
        return state[0]

    def effective_level(self, request: Request, now: float) -> float:
        age = max(0.0, now - request.arrival_time)  # self.age, inlined (hot, as above)
        return max(0.0, self.level(request) - math.floor(age / self.aging_s))

    def sort_key(self, request: Request, now: float) -> tuple:
        # effective_level, inlined: the simulator ranks every queued request at every step
        age = now - request.arrival_time
        level = self.level(request) - (math.floor(age / self.aging_s) if age > 0.0 else 0)
        return (level if level > 0 else 0, request.arrival_time, request.request_id)

    def unranked(self, requests: list[Request], now: float) -> bool:
        """A request's skip-join level is set when first asked (from what the prefix cache
        holds then): set it now for those not yet asked. The rest of a level is a function
        of its service, which does not change while it waits."""
        for request in requests:
            if request not in self._levels:
                self.level(request)
        return True

    def outranks(self, candidate: Request, running: Request, now: float) -> bool:
        return self.effective_level(candidate, now) < self.effective_level(running, now)

    def on_removed(self, request: Request) -> None:
        self._levels.pop(request, None)
