"""One simulated engine replica: the engine's own Scheduler and step code (core/step.py),
with a cost model where the model runner would be. A step starts at one instant of the
simulator's virtual clock (scheduled and timed) and completes when its time is up (its
tokens sampled, the stop rule applied by the scheduler, as in the engine). Requests sent
while it steps wait in `pending`, as in the engine's input queue, and are added between
steps.

The stand-in model samples like a greedy one, its outputs depending only on the prompt: a
request's k-th token is -1-k (distinct from prompt ids), and EOS once the request reaches
its trace output length (EngineCoreRequest.oracle_output_len).

Speculative decoding (a speculative_config and an acceptance rate): the scheduler's drafts
come from `SyntheticDrafts`, each draft token the stand-in's own next token with probability
`acceptance_rate` (so a draft's first j tokens are accepted with probability rate**j), and
the replica verifies them as the runner does: the stand-in's tokens, while they equal the
drafts, then one more. The cost model prices a verification as the k + 1 rows it computes.

With a disk tier (the scheduler's kv.disk, sim/disk_tier.py), the replica moves each step's
blocks as the runner does, writes then loads, and the cost model prices what the step waits
for: reads not prefetched before it, writes past the writer's queue.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from minivllm.core.draft_proposers import DraftProposer
from minivllm.core.request import Request
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.core.step import EngineStep, ScheduledStep, StepResult
from minivllm.core.step_batch import step_batch
from minivllm.sim.cost_model import CostModel

# The stand-in model's EOS: far below the symbolic prompts' ids and the -1-k outputs.
EOS_TOKEN_ID = -(1 << 62)


def stand_in_token(request: Request, k: int) -> int:
    """The stand-in model's k-th output token of the request: EOS at its trace length when
    that is short of max_tokens, else -1-k."""
    length = request.core_request.oracle_output_len
    eos = length is not None and length <= k + 1 < request.max_tokens
    return EOS_TOKEN_ID if eos else -1 - k


class SyntheticDrafts(DraftProposer):
    """A proposer for the scheduler: k draft tokens, each the stand-in's next token with
    probability `acceptance_rate`, else a token it never samples."""

    WRONG = EOS_TOKEN_ID + 1

    def __init__(self, acceptance_rate: float, seed: int = 0) -> None:
        if not 0.0 <= acceptance_rate <= 1.0:
            raise ValueError(f"spec_acceptance_rate must be in [0, 1], got {acceptance_rate}")
        self.rate, self.rng = acceptance_rate, random.Random(seed)

    def __call__(self, request: Request, k: int) -> list[int]:
        first = request.num_output_tokens  # the drafts guess outputs first, first + 1, ...
        return [stand_in_token(request, first + j) if self.rng.random() < self.rate
                else self.WRONG for j in range(k)]


class SimReplica:
    def __init__(self, scheduler: Scheduler, cost_model: CostModel,
                 prompt_features: Callable[[Request], list[float]] | None = None) -> None:
        """`prompt_features`: what the replica hands the scheduler in place of a prompt's
        last hidden state, when the scheduler asks for it (the `probe` predictor)."""
        self.scheduler = scheduler
        self.engine_step = EngineStep(scheduler)
        self.cost_model = cost_model
        self.prompt_features = prompt_features
        self.busy_until = math.inf  # when the step it runs ends; inf: idle
        self.pending: list[Request] = []  # sent, not yet added to the scheduler
        self.step: ScheduledStep | None = None  # that step
        self.started = 0.0  # when it began
        self._sampled: dict[str, list[int]] = {}
        self._prompt_hidden: dict[str, list[float]] = {}

    def add_pending(self) -> None:
        """Between steps: add the requests sent since the last one, in their order."""
        for request in self.pending:
            self.scheduler.add_request(request)
        self.pending = []

    def start(self, now: float) -> ScheduledStep:
        """Schedule a step now; if it computes anything, the replica is busy until the cost
        model says it ends, else it stays idle (until more work arrives)."""
        scheduled = self.engine_step.schedule()
        out, requests = scheduled.scheduler_output, self.scheduler.requests
        disk, block_size = self.scheduler.kv.disk, self.scheduler.config.block_size
        stall_tokens = read = 0  # what the step waits for the tier (disk_tier.py)
        if disk is not None:
            written = disk.write(out.disk_writes)
            read = disk.load(out.disk_loads)
            stall = disk.write_stall_bytes(written, now, self.cost_model.disk_write_bandwidth)
            stall_tokens = round(stall / disk.block_bytes * block_size)
        if out.num_scheduled_tokens:
            self.step, self.started = scheduled, now
            batch = step_batch(out, requests, block_size)
            batch.num_disk_write_tokens = stall_tokens
            batch.num_disk_load_tokens = read * block_size
            seconds = self.cost_model.step_time(batch)
            self.busy_until = now + seconds
            self.scheduler.record_step_time(seconds)
            # As the runner would: from the requests' state before the step's update.
            self._sampled = self._sample(out)
            self._prompt_hidden = self._hidden(out)
        return scheduled

    def complete(self) -> StepResult:
        """The step in flight ends: its tokens exist."""
        step, self.step, self.busy_until = self.step, None, math.inf
        return self.engine_step.update(step, self._sampled, self._prompt_hidden)

    def _sample(self, out: SchedulerOutput) -> dict[str, list[int]]:
        """A request samples when the step computes its last known token (the runner's
        rule): the stand-in's next token, and with drafts first the drafts it agrees with.
        At max_tokens (--request-max-tokens trace sets it to the trace length) the request
        ends by length."""
        sampled = {}
        for req_id, n in out.num_scheduled_tokens.items():
            r = self.scheduler.requests[req_id]
            drafts = out.scheduled_spec_decode_tokens.get(req_id, [])
            if r.num_computed_tokens + n != r.num_tokens + len(drafts):
                continue
            tokens = [stand_in_token(r, r.num_output_tokens)]
            while len(tokens) <= len(drafts) and drafts[len(tokens) - 1] == tokens[-1]:
                tokens.append(stand_in_token(r, r.num_output_tokens + len(tokens)))
            sampled[req_id] = tokens
        return sampled

    def _hidden(self, out: SchedulerOutput) -> dict[str, list[float]]:
        """The prompts whose prefill completes this step, when the scheduler wants their
        hidden states (the runner's rule)."""
        if not out.want_prompt_hidden:
            return {}
        hidden = {}
        for req_id, n in out.num_scheduled_tokens.items():
            r = self.scheduler.requests[req_id]
            if r.prompt_hidden is None and \
                    r.num_computed_tokens < r.num_prompt_tokens <= r.num_computed_tokens + n:
                hidden[req_id] = self.prompt_features(r)
        return hidden
