"""Parallel sampling (n > 1, best_of) on the engine's side, in one place. A caller's request
is num_sequences() sequences of one prompt:
- in the engine core, one scheduler Request each, with its own id (messages.seq_id) and seed,
  formed into one core/sequence_group.SequenceGroup (make_sequences); CoreRequests finds a
  sequence's request and the request's sequences;
- in the OutputProcessor, one RequestState each (request_state.py); the caller sees n of
  them: with best_of, the n most likely (best_of), known only at the end.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

from minivllm.core.request import EngineCoreRequest, Request
from minivllm.core.sequence_group import form_group
from minivllm.engine.messages import seq_id
from minivllm.sampling_params import SamplingParams


def num_sequences(params: SamplingParams) -> int:
    return params.best_of or params.n


def make_sequences(req: EngineCoreRequest, max_tokens: int,
                   banned_until_min_tokens: Iterable[int]) -> list[Request]:
    """The scheduler's Requests of a caller's request, one group, its head first: only the
    head scores prompt logprobs (the prompt is prefilled once), each has its own seed."""
    params, pooling = req.sampling_params, req.pooling_params
    count = num_sequences(params)
    every_position = (params.prompt_logprobs is not None
                      or (pooling is not None and pooling.pooling_type == "MEAN"))
    requests = [
        Request(seq_id(req.request_id, index, count), req, max_tokens,
                needs_prompt_logits=every_position and index == 0,
                seed=None if params.seed is None else params.seed + index,
                banned_until_min_tokens=banned_until_min_tokens)
        for index in range(count)]
    form_group(requests)
    return requests


class _Scored(Protocol):  # request_state.RequestState
    cumulative_logprob: float


Scored = TypeVar("Scored", bound=_Scored)


def best_of(sequences: list[Scored], n: int) -> list[Scored]:
    """The n sequences of highest cumulative logprob (ties keep their order)."""
    return sorted(sequences, key=lambda s: -s.cumulative_logprob)[:n]


class CoreRequest:
    """The core's view of one caller's request: its sequences, when it was first scheduled,
    and the steps it was scheduled in with all the tokens those steps computed (its own and
    the other requests' that shared them): read at its first token, the prefill's."""

    def __init__(self, requests: list[Request]) -> None:
        self.requests = requests
        self.first_scheduled_time: float | None = None
        self.steps = 0
        self.step_tokens = 0


class CoreRequests:
    """The engine core's requests by the caller's id, and which one each sequence (by its
    seq_id) belongs to, until it finishes."""

    def __init__(self) -> None:
        self._requests: dict[str, CoreRequest] = {}
        self._seqs: dict[str, tuple[str, int]] = {}  # sequence id -> (caller's id, index)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def __bool__(self) -> bool:
        return bool(self._requests)

    def __getitem__(self, request_id: str) -> CoreRequest:
        return self._requests[request_id]

    def add(self, request_id: str, requests: list[Request]) -> None:
        self._requests[request_id] = CoreRequest(requests)
        for index, request in enumerate(requests):
            self._seqs[request.request_id] = (request_id, index)

    def sequences(self, id_: str) -> list[Request]:
        """A caller's id: all its sequences; a sequence id: that one; else none."""
        core_request = self._requests.get(id_)
        if core_request is not None:
            return core_request.requests
        if id_ in self._seqs:
            request_id, index = self._seqs[id_]
            return [self._requests[request_id].requests[index]]
        return []

    def locate(self, sequence_id: str) -> tuple[str, int] | tuple[None, None]:
        """(the caller's id, the sequence's index), or Nones once it is forgotten."""
        return self._seqs.get(sequence_id, (None, None))

    def of(self, sequence_id: str) -> CoreRequest | None:
        """The caller's request a live sequence belongs to."""
        return self._requests.get(self.locate(sequence_id)[0])

    def forget(self, sequence_id: str) -> str | None:
        """Drop a finished sequence; when it was its request's last, drop the request too and
        return its caller's id."""
        request_id, _ = self._seqs.pop(sequence_id, (None, None))
        core_request = self._requests.get(request_id)
        if core_request is not None and all(r.is_finished for r in core_request.requests):
            del self._requests[request_id]
            return request_id
        return None
