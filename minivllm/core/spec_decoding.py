"""The scheduler's speculative decoding (core/speculative.py says how it works): which
decoding requests carry draft tokens into a step and how many, and what their verification
accepted, by request (the adaptive draft length) and in total (SchedulerStats' spec_*).

The adaptive draft length prices a draft by what a verification row costs on this machine:
the steps that only decode (and verify) are timed, and their seconds fitted as a line in
their rows, c_step + c_row x rows (core/step_cost.py's online fit, older steps forgotten).
Where the weights dominate (one pass over them verifies every row: DRAM-bound, small batch)
c_row is small against c_step and long drafts pay even at a modest acceptance; where each
row costs nearly a step, only drafts that are almost always right do."""

from __future__ import annotations

from collections.abc import Callable

from minivllm.core.draft_proposers import DRAFT_PLACEHOLDER, DraftProposer, make_proposer
from minivllm.core.request import Request
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.core.speculative import DraftTracker, SpecDecodingStats, SpeculativeConfig
from minivllm.core.step_batch import StepBatch
from minivllm.core.step_cost import OnlineStepCost


class SpecDecoding:
    def __init__(self, config: SpeculativeConfig | None, proposer: DraftProposer | None,
                 valid_drafts: Callable[[str, list[int]], int] | None) -> None:
        """`config` None: no speculative decoding (no request is given drafts).
        `proposer(request, k)`: up to k draft tokens for it; default: its method's.
        `valid_drafts(request_id, drafts)`: how many leading drafts the request's grammar
        accepts (structured outputs)."""
        self.config = config
        self.proposer = proposer or (make_proposer(config) if config else None)
        self.valid_drafts = valid_drafts
        self.stats = SpecDecodingStats()
        self._trackers: dict[str, DraftTracker] = {}  # each decoding request's acceptance
        self.step_cost = OnlineStepCost()  # decode-only steps' seconds by their rows
        self._rows = 0  # the rows of the step last scheduled if it only decoded, else 0

    def row_cost(self, num_rows: int) -> float:
        """What one more row adds to a decode step of num_rows rows, as a fraction of it;
        0 (drafts priced as free) until enough steps were timed."""
        if not self.step_cost.ready:
            return 0.0
        base = self.step_cost.step_time(StepBatch(num_decode_seqs=num_rows))
        more = self.step_cost.step_time(StepBatch(num_decode_seqs=num_rows + 1))
        return more / base - 1 if base > 0 else 0.0

    def scheduled(self, out: SchedulerOutput) -> None:
        """Note the step's rows if it only decodes and verifies (no prompt, no swap)."""
        if self.config is None:
            return
        drafts = out.scheduled_spec_decode_tokens
        decode_only = not out.swap_in and not out.swap_out and all(
            n == 1 + len(drafts.get(req_id, ())) for req_id, n in out.num_scheduled_tokens.items())
        self._rows = out.total_num_scheduled_tokens if decode_only else 0

    def step_time(self, seconds: float) -> None:
        """How long the step last scheduled took."""
        if self._rows:
            self.step_cost.observe(StepBatch(num_decode_seqs=self._rows), seconds)
            self._rows = 0

    def propose(self, request: Request, room: int, num_running: int,
                max_model_len: int) -> list[int]:
        """The request's drafts this step, at most `room` ([] where speculation is off: no
        config, more than disable_by_batch_size running, or drafts do not pay for it)."""
        spec = self.config
        if spec is None or (spec.disable_by_batch_size is not None
                            and num_running > spec.disable_by_batch_size):
            return []
        tracker = self._trackers.setdefault(request.request_id, DraftTracker())
        k = spec.num_speculative_tokens
        if spec.adaptive_draft_length:  # one more row on a step of a row per running request
            k = tracker.draft_length(k, self.row_cost(num_running))
        # A draft never runs past max_tokens or the context: the target adds one token more.
        k = min(k, room,
                request.max_tokens - request.num_output_tokens - 1,
                max_model_len - request.num_tokens - 1)
        drafts = self.proposer(request, k) if k > 0 else []
        if drafts and self.valid_drafts is not None and drafts[0] != DRAFT_PLACEHOLDER:
            drafts = drafts[:self.valid_drafts(request.request_id, drafts)]
        return drafts

    def verified(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        self.stats.observe(num_drafted, num_accepted)
        self._trackers[request_id].record(num_drafted, num_accepted)

    def finish(self, request: Request) -> None:
        self._trackers.pop(request.request_id, None)
        if self.proposer is not None:
            self.proposer.finish(request)
