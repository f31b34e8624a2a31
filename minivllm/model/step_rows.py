"""Which rows of a step's hidden states each of the step's outputs reads, and reading them.

The forward returns one row per scheduled token, request after request (query_start_loc).
From them a step
- pools the rows of a pooling request's prompt chunk (pooler.py);
- hands the scheduler the row of the last prompt token of requests whose prefill completes,
  when it asks (SchedulerOutput.want_prompt_hidden: the `probe` length predictor);
- scores the prompt positions of requests that asked for prompt_logprobs;
- samples from the last row of requests whose last token is computed this step, and with k
  draft tokens from their last k + 1 rows, to verify the drafts (spec_verify.py).
The last two need logits: `logit_rows`, the rows the LM head runs over, in the order the
prompt spans and the samples were planned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.model.input_batch import CachedRequestState, InputBatch, StepInputs
from minivllm.model.pooler import Pooler
from minivllm.model.sampler import top_logprobs
from minivllm.outputs import Logprob


@dataclass
class StepRows:
    # (request id, its first row, its end row, the position of its first row, its prompt
    # length) of each pooling request
    pooled: list[tuple[str, int, int, int, int]] = field(default_factory=list)
    # request id -> the row of its last prompt token
    last_prompt: dict[str, int] = field(default_factory=dict)
    # the rows whose logits are needed
    logit_rows: list[int] = field(default_factory=list)
    # (request id, the position of the first token scored, its first row in the logits, the
    # tokens scored, how many logprobs) of each request scoring its prompt
    prompt_spans: list[tuple[str, int, int, list[int], int]] = field(default_factory=list)
    # (request id, its first row in the logits, its drafts) of each request to sample
    sampling: list[tuple[str, int, list[int]]] = field(default_factory=list)

    @classmethod
    def plan(cls, out: SchedulerOutput, inputs: StepInputs, batch: InputBatch, pooler: Pooler,
             drafts: dict[str, list[int]]) -> StepRows:
        rows = cls()
        for req_id, end in zip(inputs.req_ids, inputs.query_start_loc[1:].tolist()):
            state = batch.requests[req_id]
            n = out.num_scheduled_tokens[req_id]
            first = end - n
            if req_id in pooler:  # its rows are pooled; it has nothing to sample
                rows.pooled.append((req_id, first, end, state.num_computed_tokens,
                                    state.num_prompt_tokens))
                continue
            if out.want_prompt_hidden:
                rows._add_last_prompt(req_id, state, first, n)
            if state.params.prompt_logprobs is not None:
                rows._add_prompt_span(req_id, state, first, n)
            rows._add_sampling(req_id, state, end, n, drafts.get(req_id, []))
        return rows

    def _add_last_prompt(self, req_id: str, state: CachedRequestState, first: int,
                         n: int) -> None:
        start, last_prompt = state.num_computed_tokens, state.num_prompt_tokens - 1
        if start <= last_prompt < start + n:
            self.last_prompt[req_id] = first + last_prompt - start

    def _add_prompt_span(self, req_id: str, state: CachedRequestState, first: int,
                         n: int) -> None:
        """Each computed prompt position that has a next prompt token to score."""
        start = state.num_computed_tokens
        num_scored = max(0, min(start + n, state.num_prompt_tokens - 1) - start)
        if num_scored:
            targets = state.token_ids[start + 1:start + 1 + num_scored].tolist()
            self.prompt_spans.append((req_id, start + 1, len(self.logit_rows), targets,
                                      state.params.prompt_logprobs))
            self.logit_rows.extend(range(first, first + num_scored))

    def _add_sampling(self, req_id: str, state: CachedRequestState, end: int, n: int,
                      drafts: list[int]) -> None:
        """A request whose last token (and its drafts) is computed this step samples."""
        k = len(drafts)
        if state.num_computed_tokens + n == state.num_tokens + k:
            self.sampling.append((req_id, len(self.logit_rows), drafts))
            self.logit_rows.extend(range(end - 1 - k, end))

    # ---- reading the rows -------------------------------------------------------------

    def pool(self, pooler: Pooler, hidden: torch.Tensor) -> dict[str, list[float]]:
        """The pooled vectors of the pooling requests whose prompt completed."""
        pooled = {}
        for req_id, first, end, start, num_prompt_tokens in self.pooled:
            vector = pooler.add_chunk(req_id, hidden[first:end], start, num_prompt_tokens)
            if vector is not None:
                pooled[req_id] = vector
        return pooled

    def prompt_hidden(self, hidden: torch.Tensor) -> dict[str, np.ndarray]:
        """The last prompt token's hidden state (a float32 numpy row) by request."""
        if not self.last_prompt:
            return {}
        rows = hidden[torch.tensor(list(self.last_prompt.values()), device=hidden.device)]
        return dict(zip(self.last_prompt, rows.float().cpu().numpy()))

    def for_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The rows of `hidden` whose logits are needed."""
        wanted = self.logit_rows
        if wanted == list(range(len(wanted))):  # the first rows, in order (all decodes)
            return hidden[:len(wanted)]
        return hidden[torch.tensor(wanted, device=hidden.device)]

    def prompt_logprobs(self, logits: torch.Tensor,
                        ) -> dict[str, tuple[int, list[dict[int, Logprob]]]]:
        """Each scored prompt token's logprob, with the top ones the request asked for."""
        scored = {}
        for req_id, first, at, targets, num in self.prompt_spans:
            logprobs = torch.log_softmax(logits[at:at + len(targets)], dim=-1)
            scored[req_id] = (first, [top_logprobs(logprobs[j], token, num)
                                      for j, token in enumerate(targets)])
        return scored
