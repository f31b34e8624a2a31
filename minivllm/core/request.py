"""EngineCoreRequest: one request as its caller sent it (every per-request field, built once
at the API edge). Request: the scheduler's view of one of its sequences — token ids,
progress and status — over that EngineCoreRequest.

There is no prefill or decode phase: `num_computed_tokens` catches up with `num_tokens`
one step at a time, which covers prefill, chunked prefill, decode and recompute alike.
Token lists are kept current as tokens arrive (nothing concatenates prompt + output on
the hot path), and the hashes of full blocks are computed once each, by the KV manager.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import msgspec

from minivllm.lora_request import LoRARequest
from minivllm.pooling_params import PoolingParams
from minivllm.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (
            RequestStatus.FINISHED_STOPPED,
            RequestStatus.FINISHED_LENGTH,
            RequestStatus.FINISHED_ABORTED,
        )


class EngineCoreRequest(msgspec.Struct, tag="add", omit_defaults=True):
    """One request, as the API edge built it: everything the engine knows about it, every
    per-request field in one place. It crosses to the engine core as is (msgpack, tag "add");
    the scheduler's Requests hold it, and the policies read their fields from it. A new
    per-request field is one line here, plus the edge that sets it and the code that reads it.
    """

    request_id: str  # the caller's id; a request of n > 1 sequences is one message
    prompt_token_ids: list[int]
    # Resolved by the edge (engine/messages.make_core_request: generation defaults,
    # max_tokens, best_of's logprobs); max_tokens None (vLLM's call form, a prompt): the core
    # gives it the rest of the context. None only in a request built without an edge
    # (Request.make): EOS and length stops alone.
    sampling_params: SamplingParams
    arrival_time: float
    priority: int = 0  # the priority policy's (lower first)
    cache_salt: str | None = None  # the prefix cache shares blocks only within one salt
    # The true output length, known only in the lab (bench replaying a trace): read by the
    # `oracle` length predictor alone, and refused by a core running any other.
    oracle_output_len: int | None = None
    # For the scheduling policies: the tenant (OpenAI's `user`, vtc's unit of fairness) and
    # latency deadlines in ms after arrival (edf; None: the server's defaults).
    user: str | None = None
    ttft_slo_ms: float | None = None
    e2e_slo_ms: float | None = None
    lora_request: LoRARequest | None = None  # the adapter it runs with (None: the base)
    # A pooling request (embeddings): its prompt is prefilled and pooled, nothing is
    # sampled; its sampling_params only say one sequence, one final output.
    pooling_params: PoolingParams | None = None

    @property
    def lora_int_id(self) -> int:
        return 0 if self.lora_request is None else self.lora_request.lora_int_id

    @property
    def prefix_cache_key(self) -> str | tuple | None:
        """What a prompt's first block hash covers beside its tokens: blocks are shared only
        within one cache_salt and one adapter (an adapter changes every layer's K/V)."""
        if self.lora_request is None:
            return self.cache_salt
        return (self.cache_salt, self.lora_request.lora_int_id)


class Request:
    """One sequence: a request of n > 1 sequences is n Requests over one EngineCoreRequest."""

    def __init__(
        self,
        request_id: str,
        core_request: EngineCoreRequest,
        max_tokens: int,
        needs_prompt_logits: bool = False,
        seed: int | None = None,
        banned_until_min_tokens: Iterable[int] = (),
    ) -> None:
        self.request_id = request_id  # the sequence's id (engine/messages.seq_id)
        # The request's fields as its caller gave them (priority, user, deadlines, ...): the
        # policies read them here.
        self.core_request = core_request
        self.prompt_token_ids = list(core_request.prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.num_new_tokens = 0  # output tokens the last step appended (several: speculation)
        self.all_token_ids = list(self.prompt_token_ids)  # prompt, then outputs as they come
        self.max_tokens = max_tokens
        self.arrival_time = core_request.arrival_time
        # Prompt logprobs (and mean pooling) need every prompt position's output, so such
        # a request never skips prompt tokens through the prefix cache.
        self.needs_prompt_logits = needs_prompt_logits
        # What the model side needs to sample for it; opaque to the scheduler, which only
        # hands it over once, when the request first reaches the runner.
        self.sampling_params = core_request.sampling_params
        self.seed = seed
        self.banned_until_min_tokens = tuple(banned_until_min_tokens)
        # Output-length prediction (core/length_predictor.py): the final-norm hidden state
        # of the last prompt token (a numpy row), handed over by the runner when the prefill
        # completes, for `probe`. And the prediction the ranking quality is measured with:
        # made at arrival, again at admission (first scheduled), and again when the hidden
        # state arrives (for predictors that read it).
        self.prompt_hidden: Any = None
        self.predicted_output_len: float | None = None
        self.status = RequestStatus.WAITING
        self.stop_reason: int | None = None  # the stop token id that finished it (check_stop)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache (first admission)
        self.block_ids: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of its full blocks (KV manager)
        self.disk_keys: list[bytes] = []  # their stable keys, with a disk tier (kv_disk_keys)
        self.swap_block_ids: list[int] = []  # host blocks while SWAPPED
        self.num_preemptions = 0
        self.first_scheduled_step: int | None = None
        self.last_admitted_step = 0  # step at which it (re)entered running; for run quanta
        # Parallel sampling (n > 1): the SequenceGroup of the sequences of its prompt
        # (core/sequence_group.py); None for a request of one sequence.
        self.group = None

    @classmethod
    def make(cls, request_id: str, prompt_token_ids: list[int], max_tokens: int,
             arrival_time: float = 0.0, *, sampling_params: SamplingParams | None = None,
             needs_prompt_logits: bool = False, **fields: Any) -> Request:
        """A request built without an API edge (the simulator, tests); `fields` are
        EngineCoreRequest's (priority, user, cache_salt, ...)."""
        core_request = EngineCoreRequest(request_id, list(prompt_token_ids), sampling_params,
                                         arrival_time, **fields)
        return cls(request_id, core_request, max_tokens, needs_prompt_logits)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def max_total_tokens(self) -> int:
        return self.num_prompt_tokens + self.max_tokens

    @property
    def is_pooling(self) -> bool:
        """It ends when its prompt is computed, with the runner's pooled vector."""
        return self.core_request.pooling_params is not None

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.value}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens})"
        )


def check_context_length(num_prompt_tokens: int, max_tokens: int | None,
                         max_model_len: int, where: str = "prompt") -> None:
    """The one check that a prompt and its max_tokens fit the model's context; the message
    is the one OpenAI clients know. max_tokens None: the rest of the context."""
    if max_tokens is None and num_prompt_tokens >= max_model_len:
        raise ValueError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {num_prompt_tokens} input tokens. Please reduce the length of the "
            f"{where}.")
    if max_tokens is not None and num_prompt_tokens + max_tokens > max_model_len:
        raise ValueError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the "
            f"{where}, {max_tokens} in the completion). Please reduce the length of the {where} "
            "or completion.")
