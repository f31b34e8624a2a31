"""Where a request's draft tokens come from, one class per --speculative-config method. The
scheduler calls `proposer(request, k)` for up to k drafts while the request decodes, and
`proposer.finish(request)` when it ends (core/scheduler.py).

- `ngram`: prompt lookup over the request's own tokens (core/speculative.py).
- `suffix`: suffix decoding: a suffix tree over the request's prompt and output, and one over
  recent requests' outputs (core/suffix_tree.py); the better-scored proposal wins.
- `draft_model`: a smaller model proposes, and it runs where the weights are, in the runner
  (model/draft_model.py): the scheduler only sets how many drafts and gives them KV slots,
  as placeholders the runner fills in before the target verifies them.
"""

from __future__ import annotations

from collections import deque
from itertools import count

from minivllm.core.request import Request
from minivllm.core.speculative import SpeculativeConfig, ngram_propose
from minivllm.core.suffix_tree import SuffixTree

# A draft token the runner's draft model replaces (scheduled_spec_decode_tokens).
DRAFT_PLACEHOLDER = -1


class DraftProposer:
    """What the scheduler calls; the simulator's SyntheticDrafts is one too."""

    def __call__(self, request: Request, k: int) -> list[int]:
        raise NotImplementedError

    def finish(self, request: Request) -> None:
        """The request ended: drop what was kept for it."""


class NgramProposer(DraftProposer):
    def __init__(self, config: SpeculativeConfig) -> None:
        self.n_min, self.n_max = config.prompt_lookup_min, config.prompt_lookup_max

    def __call__(self, request: Request, k: int) -> list[int]:
        return ngram_propose(request.all_token_ids, k, self.n_min, self.n_max)


class SuffixProposer(DraftProposer):
    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        depth = config.suffix_decoding_max_tree_depth
        self.local: dict[str, SuffixTree] = {}  # request id -> its prompt and output so far
        self.cache = SuffixTree(depth)  # finished requests' outputs, oldest evicted first
        self._cached: deque[int] = deque()
        self._keys = count()

    def __call__(self, request: Request, k: int) -> list[int]:
        config, depth = self.config, self.config.suffix_decoding_max_tree_depth
        tree = self.local.get(request.request_id)
        if tree is None:
            tree = self.local[request.request_id] = SuffixTree(depth)
        tokens = request.all_token_ids
        tree.extend(0, tokens[tree.seq_len(0):])
        context = tokens[-depth:]
        proposals = [t.propose(context, k, config.suffix_decoding_min_token_prob,
                               config.suffix_decoding_max_spec_factor, context_included=own)
                     for t, own in ((tree, True), (self.cache, False))]
        return max(proposals, key=lambda p: p.score).token_ids

    def finish(self, request: Request) -> None:
        self.local.pop(request.request_id, None)
        limit = self.config.suffix_decoding_max_cached_requests
        if limit == 0 or not request.output_token_ids:
            return
        key = next(self._keys)  # not the request id: ids may be reused
        self.cache.extend(key, request.output_token_ids)
        self._cached.append(key)
        if len(self._cached) > limit:
            self.cache.remove(self._cached.popleft())


class DraftModelSlots(DraftProposer):
    """draft_model: k placeholders, which the runner's draft model fills in."""

    def __call__(self, request: Request, k: int) -> list[int]:
        return [DRAFT_PLACEHOLDER] * k


def make_proposer(config: SpeculativeConfig) -> DraftProposer:
    return {"ngram": NgramProposer, "suffix": SuffixProposer,
            "draft_model": lambda _: DraftModelSlots()}[config.method](config)
