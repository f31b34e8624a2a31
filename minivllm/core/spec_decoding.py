"""The scheduler's speculative decoding (core/speculative.py says how it works): which
decoding requests carry draft tokens into a step and how many, and what their verification
accepted, by request (the adaptive draft length) and in total (SchedulerStats' spec_*)."""

from __future__ import annotations

from collections.abc import Callable

from minivllm.core.draft_proposers import DRAFT_PLACEHOLDER, DraftProposer, make_proposer
from minivllm.core.request import Request
from minivllm.core.speculative import DraftTracker, SpecDecodingStats, SpeculativeConfig


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

    def propose(self, request: Request, room: int, num_running: int,
                max_model_len: int) -> list[int]:
        """The request's drafts this step, at most `room` ([] where speculation is off: no
        config, more than disable_by_batch_size running, or its acceptance rate too low)."""
        spec = self.config
        if spec is None or (spec.disable_by_batch_size is not None
                            and num_running > spec.disable_by_batch_size):
            return []
        tracker = self._trackers.setdefault(request.request_id, DraftTracker())
        # A draft never runs past max_tokens or the context: the target adds one token more.
        k = min(tracker.draft_length(spec), room,
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
