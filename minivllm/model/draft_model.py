"""The `draft_model` method of speculative decoding: a smaller model with the target's
tokenizer proposes the drafts, greedily, in the runner, right before the target verifies them.

It has a KV cache of its own laid out like the target's (the same number of blocks, its own
layers and heads), so the scheduler's block tables, slots, copies and swaps serve both. The
scheduler gives a drafting request KV slots for its last token and k placeholders
(core/draft_proposers.py); here the draft model first runs over the request's tokens it has
not seen, up to that last token (the whole prompt the first time, one or two tokens a step
after: it runs only for requests that draft, so a request whose drafts are off costs
nothing), which leaves the logits for the first draft, then one token at a time for the
rest, writing its K/V into the slots the target overwrites next. Its K/V in a block shared
through the prefix cache is what any request writes there: the same tokens.

For a greedy request the draft is the draft model's argmax (deterministic: the verification
rule of model/spec_verify.py keeps the output the target's own tokens); for a sampled one it
is drawn from the draft model's distribution under the request's temperature and filters,
and verified by speculative sampling (model/spec_verify.py): the output is distributed as
the target's, whatever the draft model proposes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minivllm.model.input_batch import InputBatch, StepInputs

Forward = Callable[[StepInputs, torch.nn.Module, tuple], torch.Tensor]
# (request ids, the draft model's logits [N, V] at their draft j, j) -> each one's draft
# token and the distribution it was drawn from (None: chosen deterministically)
Choose = Callable[[list[str], torch.Tensor, int], tuple[list[int], list[torch.Tensor | None]]]


class DraftModel:
    def __init__(self, model: torch.nn.Module, caches: tuple, host_caches: tuple) -> None:
        self.model = model
        self.caches = caches  # (k, v): [layers, blocks + 1, block_size, kv_heads, head_dim]
        self.host_caches = host_caches  # the swap pool's
        # request id -> how many of its leading positions hold the draft model's K/V
        self.computed: dict[str, int] = {}

    def remove(self, req_id: str) -> None:
        self.computed.pop(req_id, None)

    def verified(self, req_id: str, num_computed: int) -> None:
        """The target kept the request's K/V up to num_computed positions: past them the
        draft K/V is of rejected drafts (recomputed when it drafts again)."""
        if req_id in self.computed:
            self.computed[req_id] = min(self.computed[req_id], num_computed)

    def propose(self, wanted: dict[str, int], batch: InputBatch, forward: Forward,
                choose: Choose) -> tuple[dict[str, list[int]], dict[str, torch.Tensor]]:
        """`wanted[r]` drafts for each request r (the step's placeholders), and the
        distributions [k, V] they were drawn from, for the requests whose drafts `choose`
        samples."""
        if not wanted:
            return {}, {}
        counts, starts = {}, {}
        for req_id in wanted:
            state = batch.requests[req_id]
            # From where its draft K/V ends (`verified` cut it back to the accepted tokens); a
            # request preempted to recompute starts again at 0.
            start = min(self.computed.get(req_id, 0), state.num_computed_tokens)
            end = state.num_computed_tokens + 1  # its last token: the first draft's logits
            counts[req_id], starts[req_id] = end - start, start
            self.computed[req_id] = end
        inputs = batch.prepare(counts, starts)
        hidden = forward(inputs, self.model, self.caches)
        ends = inputs.query_start_loc[1:].tolist()
        last_rows = {r: ends[i] - 1 for i, r in enumerate(inputs.req_ids)}
        drafts = {r: [] for r in last_rows}
        probs: dict[str, list[torch.Tensor]] = {}
        for j in range(max(wanted.values())):
            if j:  # feed draft j at its position, for the requests that want more
                alive = [r for r in drafts if wanted[r] > j]
                for r in alive:
                    batch.requests[r].put_drafts(drafts[r])
                inputs = batch.prepare({r: 1 for r in alive},
                                       {r: self.computed[r] + j - 1 for r in alive})
                hidden = forward(inputs, self.model, self.caches)
                last_rows = {r: i for i, r in enumerate(inputs.req_ids)}
            rows = torch.tensor(list(last_rows.values()), device=hidden.device)
            ids = list(last_rows)
            tokens, distributions = choose(ids, self.model.compute_logits(hidden[rows]), j)
            for r, token, q in zip(ids, tokens, distributions):
                drafts[r].append(token)
                if q is not None:
                    probs.setdefault(r, []).append(q)
        for r, k in wanted.items():
            self.computed[r] += k - 1  # drafts 1 .. k - 1 were fed
        return drafts, {r: torch.stack(q) for r, q in probs.items()}
