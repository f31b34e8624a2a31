"""The runner's persistent view of the requests it serves, updated from the scheduler's
per-step diffs: each request's token ids (the runner samples them, so it appends them
itself) and a row of one block-table array. Building a step's inputs is then a few
vectorised numpy operations over those rows, not per-token Python.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from minivllm.core.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput


class CachedRequestState:
    """One request's token ids, kept until it finishes (also while it is preempted)."""

    __slots__ = ("req_id", "params", "token_ids", "num_tokens", "num_prompt_tokens",
                 "num_computed_tokens", "row", "num_blocks", "lora_int_id")

    def __init__(self, new: NewRequestData, row: int) -> None:
        tokens = new.prompt_token_ids + new.output_token_ids
        self.req_id = new.req_id
        self.params = new.sampling_params
        self.token_ids = np.empty(max(16, 2 * len(tokens)), dtype=np.int64)
        self.token_ids[:len(tokens)] = tokens
        self.num_tokens = len(tokens)
        self.num_prompt_tokens = len(new.prompt_token_ids)
        self.num_computed_tokens = new.num_computed_tokens
        self.row = row
        self.num_blocks = 0
        self.lora_int_id = new.lora_int_id

    def append(self, token_id: int) -> None:
        if self.num_tokens == len(self.token_ids):
            self.token_ids = np.resize(self.token_ids, 2 * self.num_tokens)
        self.token_ids[self.num_tokens] = token_id
        self.num_tokens += 1

    def put_drafts(self, draft_token_ids: list[int]) -> None:
        """Draft tokens after the known ones, not counted in num_tokens: the step's inputs
        read them there; the tokens the step accepts are appended over them."""
        end = self.num_tokens + len(draft_token_ids)
        if end > len(self.token_ids):
            self.token_ids = np.resize(self.token_ids, 2 * end)
        self.token_ids[self.num_tokens:end] = draft_token_ids


@dataclass
class StepInputs:
    """A step's flattened batch in numpy, requests ordered decodes first, then the ones that
    verify drafts, then prefill chunks."""

    req_ids: list[str]
    token_ids: np.ndarray  # [T]
    positions: np.ndarray  # [T]
    slot_mapping: np.ndarray  # [T]
    block_table: np.ndarray  # [B, max_blocks]
    seq_lens: np.ndarray  # [B]
    query_start_loc: np.ndarray  # [B + 1]
    num_decodes: int
    num_verifies: int = 0  # the requests after the decodes that verify drafts


class InputBatch:
    def __init__(self, max_blocks_per_request: int, block_size: int) -> None:
        self.block_size = block_size
        self.requests: dict[str, CachedRequestState] = {}
        self.block_table = np.zeros((64, max_blocks_per_request), dtype=np.int64)
        self._free_rows = list(range(63, -1, -1))

    # ---- the diffs ------------------------------------------------------------------

    def apply(self, out: SchedulerOutput) -> list[NewRequestData]:
        """Drop finished requests, add new ones, apply the cached ones' diffs. Returns the
        new requests (the runner registers them with the sampler)."""
        for req_id in out.finished_req_ids:
            self.remove(req_id)
        for new in out.scheduled_new_reqs:
            state = CachedRequestState(new, self._take_row())
            self.requests[new.req_id] = state
            self._set_blocks(state, new.block_ids, replace=True)
        self._apply_cached(out.scheduled_cached_reqs)
        return out.scheduled_new_reqs

    def _apply_cached(self, cached: CachedRequestData) -> None:
        for req_id, computed, block_ids, replace in zip(
                cached.req_ids, cached.num_computed_tokens, cached.new_block_ids,
                cached.replace_block_ids):
            state = self.requests[req_id]
            state.num_computed_tokens = computed
            self._set_blocks(state, block_ids, replace)

    def _set_blocks(self, state: CachedRequestState, block_ids: list[int], replace: bool) -> None:
        start = 0 if replace else state.num_blocks
        self.block_table[state.row, start:start + len(block_ids)] = block_ids
        state.num_blocks = start + len(block_ids)

    def remove(self, req_id: str) -> bool:
        state = self.requests.pop(req_id, None)
        if state is None:
            return False
        self._free_rows.append(state.row)
        return True

    def _take_row(self) -> int:
        if not self._free_rows:  # more requests than rows: double the table
            rows = self.block_table.shape[0]
            self.block_table = np.concatenate([self.block_table, np.zeros_like(self.block_table)])
            self._free_rows = list(range(2 * rows - 1, rows - 1, -1))
        return self._free_rows.pop()

    # ---- a step's inputs ------------------------------------------------------------

    def prepare(self, num_scheduled_tokens: dict[str, int],
                start_at: dict[str, int] | None = None,
                verifying: Collection[str] = ()) -> StepInputs:
        """The step's inputs: each request's tokens from its computed count on (or from
        `start_at`, the draft model's own positions: model/draft_model.py). `verifying`:
        the requests whose tokens are their last one and drafts."""
        decodes = [r for r, n in num_scheduled_tokens.items() if n == 1]
        verifies = [r for r, n in num_scheduled_tokens.items() if n > 1 and r in verifying]
        prefills = [r for r, n in num_scheduled_tokens.items()
                    if n > 1 and r not in verifying]
        req_ids = decodes + verifies + prefills
        states = [self.requests[r] for r in req_ids]
        counts = np.fromiter((num_scheduled_tokens[r] for r in req_ids), np.int64, len(req_ids))
        starts = np.fromiter((s.num_computed_tokens for s in states) if start_at is None
                             else (start_at[r] for r in req_ids), np.int64, len(states))
        query_start_loc = np.zeros(len(req_ids) + 1, dtype=np.int64)
        np.cumsum(counts, out=query_start_loc[1:])
        total = int(query_start_loc[-1])
        token_ids = np.empty(total, dtype=np.int64)
        token_ids[:len(decodes)] = [s.token_ids[start]
                                    for s, start in zip(states, starts[:len(decodes)])]
        for i in range(len(decodes), len(states)):
            s, at = states[i], query_start_loc[i]
            token_ids[at:at + counts[i]] = s.token_ids[starts[i]:starts[i] + counts[i]]
        # Token t of request i sits at position starts[i] + (t - query_start_loc[i]).
        positions = np.arange(total) + np.repeat(starts - query_start_loc[:-1], counts)
        seq_lens = starts + counts
        width = -(-int(seq_lens.max()) // self.block_size)
        rows = np.fromiter((s.row for s in states), np.int64, len(states))
        block_table = self.block_table[rows, :width]
        owner = np.repeat(np.arange(len(req_ids)), counts)
        slot_mapping = (block_table[owner, positions // self.block_size] * self.block_size
                        + positions % self.block_size)
        return StepInputs(req_ids, token_ids, positions, slot_mapping, block_table, seq_lens,
                          query_start_loc, len(decodes), len(verifies))
