"""The scheduler's speculative decoding (core/speculative.py says how it works): which
decoding requests carry draft tokens into a step and how many, and what their verification
accepted, by request (the adaptive draft length) and in total (SchedulerStats' spec_*).

The adaptive draft length prices a draft by what it costs on this machine: the steps that
only decode (and verify) are timed, and their seconds fitted as c_step + c_row x rows +
c_pass x draft-model passes (core/online_fit.py, older steps forgotten). A draft token adds a
verification row; the draft model's also a pass of the draft model, shared by every request
drafting in the step (priced as shared by all the running requests). Where the weights
dominate (one pass over them verifies every row: DRAM-bound, small batch) c_row is small
against c_step and long drafts pay even at a modest acceptance; where each row costs nearly a
step, only drafts that are almost always right do. At batch 1 a draft-model token always adds
one row and one pass, so the fit cannot tell them apart and prices their sum as the row.

draft_model with `prompt_lookup` (the default): where prompt lookup finds drafts (the
request's last tokens occurred before: a copy, an edit) they are taken, free of any draft
model pass; elsewhere the draft model drafts. Each source has its own acceptance per request.
"""

from __future__ import annotations

from collections.abc import Callable

from minivllm.core.draft_proposers import DRAFT_PLACEHOLDER, DraftProposer, make_proposer
from minivllm.core.online_fit import OnlineLinearFit
from minivllm.core.request import Request
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.core.speculative import (
    DraftTracker,
    SpecDecodingStats,
    SpeculativeConfig,
    ngram_propose,
)


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
        # each decoding request's acceptance: of its method's drafts, and of prompt lookup's
        # where draft_model takes them first
        self._trackers: dict[str, DraftTracker] = {}
        self._lookup_trackers: dict[str, DraftTracker] = {}
        # every request's verifications together, by source: where a new request starts
        # (at 1 before any: optimistic, so that a method gets tried)
        self._recent = {"method": DraftTracker(), "lookup": DraftTracker()}
        self._num_new = {"method": 0, "lookup": 0}  # requests each source has seen
        self._looked_up: set[str] = set()  # requests whose drafts this step are prompt lookup's
        self.lookup_first = bool(config and config.method == "draft_model"
                                 and config.prompt_lookup)
        # decode-only steps' seconds: c_step + c_row x rows + c_pass x draft model passes
        # (features the steps cannot tell apart are dropped: see the docstring)
        self.step_cost = OnlineLinearFit(3, collinear=1e-6)
        self._step: list[float] | None = None  # the step last scheduled, if it only decoded
        self._model_drafted: set[str] = set()  # requests the draft model has caught up on

    def _relative(self, coefficient: int, num_rows: int) -> float:
        """A coefficient as a fraction of a decode step of num_rows rows; 0 (drafts priced
        as free) until enough steps were timed."""
        if not self.step_cost.ready:
            return 0.0
        base = self.step_cost.predict([1.0, float(num_rows), 0.0])
        return self.step_cost.coefficients[coefficient] / base if base > 0 else 0.0

    def row_cost(self, num_rows: int) -> float:
        """What one more row adds to a decode step of num_rows rows, as a fraction of it."""
        return self._relative(1, num_rows)

    def pass_cost(self, num_rows: int) -> float:
        """What one more pass of the draft model adds to such a step, as a fraction of it."""
        return self._relative(2, num_rows)

    def scheduled(self, out: SchedulerOutput) -> None:
        """Note the step's rows and draft model passes if it only decodes and verifies (no
        prompt, no swap, and no request the draft model sees for the first time: it then
        runs over the whole prompt)."""
        if self.config is None:
            return
        drafts = out.scheduled_spec_decode_tokens
        decode_only = not out.swap_in and not out.swap_out and all(
            n == 1 + len(drafts.get(req_id, ())) for req_id, n in out.num_scheduled_tokens.items())
        by_model = {r: len(d) for r, d in drafts.items() if d and d[0] == DRAFT_PLACEHOLDER}
        first_seen = not by_model.keys() <= self._model_drafted
        self._model_drafted.update(by_model)
        self._step = None
        if decode_only and not first_seen:
            self._step = [1.0, float(out.total_num_scheduled_tokens),
                          float(max(by_model.values(), default=0))]

    def step_time(self, seconds: float) -> None:
        """How long the step last scheduled took."""
        if self._step is not None:
            self.step_cost.observe(self._step, seconds)
            self._step = None

    def propose(self, request: Request, room: int, num_running: int,
                max_model_len: int) -> list[int]:
        """The request's drafts this step, at most `room` ([] where speculation is off: no
        config, more than disable_by_batch_size running, or drafts do not pay for it)."""
        spec = self.config
        if spec is None or (spec.disable_by_batch_size is not None
                            and num_running > spec.disable_by_batch_size):
            return []
        # A draft never runs past max_tokens or the context: the target adds one token more.
        limit = min(room, request.max_tokens - request.num_output_tokens - 1,
                    max_model_len - request.num_tokens - 1)
        row = self.row_cost(num_running)  # one more row on a step of a row a running request
        drafts = []
        self._looked_up.discard(request.request_id)
        if self.lookup_first:
            tracker = self._tracker(self._lookup_trackers, "lookup", request.request_id)
            k = min(self._length(tracker, row), limit)
            drafts = ngram_propose(request.all_token_ids, k, spec.prompt_lookup_min,
                                   spec.prompt_lookup_max) if k > 0 else []
            if drafts:
                self._looked_up.add(request.request_id)
        if not drafts:
            tracker = self._tracker(self._trackers, "method", request.request_id)
            if spec.method == "draft_model":  # and its share of the draft model's passes
                row += self.pass_cost(num_running) / max(num_running, 1)
            k = min(self._length(tracker, row), limit)
            drafts = self.proposer(request, k) if k > 0 else []
        if drafts and self.valid_drafts is not None and drafts[0] != DRAFT_PLACEHOLDER:
            drafts = drafts[:self.valid_drafts(request.request_id, drafts)]
        return drafts

    def _tracker(self, trackers: dict[str, DraftTracker], source: str,
                 request_id: str) -> DraftTracker:
        """The request's acceptance of the source's drafts. A new request starts at the
        acceptance recent requests had (a request's first drafts are not free either), but
        every 8th at 1: a draft model's requests do not probe, and the traffic may have
        changed since drafts stopped paying."""
        tracker = trackers.get(request_id)
        if tracker is None:
            explore = self._num_new[source] % 8 == 0
            self._num_new[source] += 1
            tracker = trackers[request_id] = DraftTracker(
                accepted=1.0 if explore else self._recent[source].acceptance,
                probes=source == "lookup" or self.config.method != "draft_model")
        return tracker

    def _length(self, tracker: DraftTracker, row_cost: float) -> int:
        k = self.config.num_speculative_tokens
        return tracker.draft_length(k, row_cost) if self.config.adaptive_draft_length else k

    def verified(self, request_id: str, drafts: list[int], num_accepted: int) -> None:
        self.stats.observe(len(drafts), num_accepted)
        source = "lookup" if request_id in self._looked_up else "method"
        trackers = self._lookup_trackers if source == "lookup" else self._trackers
        trackers[request_id].record(len(drafts), num_accepted)
        self._recent[source].record(len(drafts), num_accepted, forget=0.98)

    def finish(self, request: Request) -> None:
        self._trackers.pop(request.request_id, None)
        self._lookup_trackers.pop(request.request_id, None)
        self._looked_up.discard(request.request_id)
        self._model_drafted.discard(request.request_id)
        if self.proposer is not None:
            self.proposer.finish(request)
