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

Greedy drafts are deterministic, so the verification rule of model/spec_verify.py stays
exact: the output is the target model's, whatever the draft model proposes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.model.input_batch import InputBatch, StepInputs

Forward = Callable[[StepInputs, torch.nn.Module, tuple], torch.Tensor]


class DraftModel:
    def __init__(self, model: torch.nn.Module, caches: tuple, host_caches: tuple) -> None:
        self.model = model
        self.caches = caches  # (k, v): [layers, blocks + 1, block_size, kv_heads, head_dim]
        self.host_caches = host_caches  # the swap pool's
        # request id -> how many of its leading positions hold the draft model's K/V
        self.computed: dict[str, int] = {}

    def remove(self, req_id: str) -> None:
        self.computed.pop(req_id, None)

    def propose(self, out: SchedulerOutput, batch: InputBatch,
                forward: Forward) -> dict[str, list[int]]:
        """The drafts for the step's placeholders (scheduled_spec_decode_tokens), as many per
        request as it has placeholders."""
        wanted = {r: len(d) for r, d in out.scheduled_spec_decode_tokens.items()}
        if not wanted:
            return {}
        counts, starts = {}, {}
        for req_id in wanted:
            state = batch.requests[req_id]
            # From where its draft K/V ends: positions past the target's computed count were
            # drafts, maybe rejected; a request preempted to recompute starts again at 0.
            start = min(self.computed.get(req_id, 0), state.num_computed_tokens)
            end = state.num_computed_tokens + 1  # its last token: the first draft's logits
            counts[req_id], starts[req_id] = end - start, start
            self.computed[req_id] = end
        inputs = batch.prepare(counts, starts)
        hidden = forward(inputs, self.model, self.caches)
        ends = inputs.query_start_loc[1:].tolist()
        last_rows = {r: ends[i] - 1 for i, r in enumerate(inputs.req_ids)}
        drafts = {r: [] for r in last_rows}
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
            tokens = self.model.compute_logits(hidden[rows]).argmax(dim=-1).tolist()
            for r, token in zip(last_rows, tokens):
                drafts[r].append(token)
        for r, k in wanted.items():
            self.computed[r] += k - 1  # drafts 1 .. k - 1 were fed
        return drafts
