"""Pooler: a pooling request's prompt pooled from the final-norm hidden states of the steps
that compute it (pooling_params.py says how). Chunked prefill spreads a prompt over steps:
MEAN keeps a running sum over the chunks, LAST waits for the chunk that holds the last
prompt token. A recompute after a preemption starts the prompt over at position 0, and the
sum with it; a swap keeps both.
"""

from __future__ import annotations

import torch

from minivllm.pooling_params import PoolingParams


class Pooler:
    def __init__(self) -> None:
        self._params: dict[str, PoolingParams] = {}  # resolved by the engine core
        self._sums: dict[str, torch.Tensor] = {}  # MEAN: the sum of the positions so far

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._params

    def add_request(self, req_id: str, params: PoolingParams) -> None:
        self._params[req_id] = params

    def remove(self, req_id: str) -> None:
        self._params.pop(req_id, None)
        self._sums.pop(req_id, None)

    def add_chunk(self, req_id: str, rows: torch.Tensor, start: int,
                  num_prompt_tokens: int) -> list[float] | None:
        """`rows`: the hidden states of prompt positions start, start + 1, ... computed this
        step. The pooled vector once they reach the prompt's end, else None."""
        params = self._params[req_id]
        done = start + len(rows) == num_prompt_tokens
        if params.pooling_type == "MEAN":
            total = rows.float().sum(dim=0)
            if start > 0:  # MEAN requests skip no cached prefix: start > 0 is a later chunk
                total += self._sums[req_id]
            self._sums[req_id] = total
            vector = total / num_prompt_tokens if done else None
        else:  # LAST
            vector = rows[-1].float() if done else None
        if vector is None:
            return None
        if params.dimensions is not None:
            vector = vector[:params.dimensions]
        if params.normalize:
            vector = torch.nn.functional.normalize(vector, dim=0)
        return vector.cpu().tolist()
