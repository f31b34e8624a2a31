"""What crosses between the API server (frontend) and the engine core: msgspec Structs,
msgpack on the wire. Plain data only — ids, token ids, numbers, strings — never a live
object; the frontend keeps text, detokenizers and RequestOutputs on its side.

Into the core: EngineCoreRequest (defined in core/request.py, which the scheduler's Requests
hold; re-exported here), EngineCoreAbort, EngineCoreUtility, EngineCoreTracing,
EngineCoreShutdown. Out of it: EngineCoreReady once, then one EngineCoreOutputs per step (and
one after a batch of inputs that changed something without a step), UtilityResult, and
EngineCoreDead last. While tracing is on (someone watches the dashboard), an EngineCoreOutputs
carries a TraceSample once per interval: request lifecycles and the block map, not tokens.
"""

from __future__ import annotations

import dataclasses
import time

import msgspec

from minivllm.core.lifecycle import TraceSample
from minivllm.core.request import EngineCoreRequest
from minivllm.core.scheduler_stats import SchedulerStats
from minivllm.outputs import Logprob
from minivllm.pooling_params import PoolingParams
from minivllm.sampling_params import RequestOutputKind, SamplingParams

# One position's logprobs, compact: (token ids, logprobs, ranks), the chosen token first.
LogprobsLists = tuple[list[int], list[float], list[int | None]]


class EngineCoreAbort(msgspec.Struct, tag="abort", omit_defaults=True):
    request_ids: list[str]  # callers' ids (every sequence) or sequence ids (seq_id())
    stopped: bool = False  # a stop string ended them: they count as finished, not aborted


class EngineCoreUtility(msgspec.Struct, tag="utility"):
    call_id: int
    method: str  # a name in core_proc.UTILITY_METHODS, e.g. "get_stats"
    kwargs: dict[str, bool] = {}  # e.g. reset_prefix_cache's reset_external


class EngineCoreTracing(msgspec.Struct, tag="tracing"):
    enabled: bool  # on while a dashboard client listens
    interval: float = 0.5  # seconds between two TraceSamples


class EngineCoreShutdown(msgspec.Struct, tag="shutdown"):
    pass


EngineCoreInput = (EngineCoreRequest | EngineCoreAbort | EngineCoreUtility | EngineCoreTracing
                   | EngineCoreShutdown)


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """What one sequence did in one step."""

    request_id: str  # the caller's id
    index: int = 0  # the sequence within the request (n / best_of)
    new_token_ids: list[int] = []
    new_logprobs: list[LogprobsLists] | None = None  # one per new token
    prompt_logprobs: tuple[int, list[LogprobsLists]] | None = None  # (first position, ...)
    finish_reason: str | None = None  # "stop" (EOS, a stop token) | "length" | "abort"
    stop_reason: int | None = None  # the stop token id
    num_cached_tokens: int = 0
    first_scheduled_time: float | None = None
    # With a request's first token: the steps until it, and all the tokens they computed
    prefill_steps: int = 0
    prefill_step_tokens: int = 0
    # A request the core turned away or failed: error_kind is "invalid" (a ValueError),
    # "overloaded" (EngineOverloadedError; overload_reason is its reason), "failed" (any
    # other error adding it), "timeout" (it waited too long, never scheduled) or "deadline"
    # (edf shed it: it could no longer make its deadline).
    error: str | None = None
    error_kind: str | None = None
    overload_reason: str | None = None
    # A pooling request's vector (embeddings), with its finish: it has no tokens.
    pooled: list[float] | None = None


class EngineCoreOutputs(msgspec.Struct, tag="outputs", omit_defaults=True):
    timestamp: float  # time.time() after the step: the frontend's token timestamps
    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    num_prompt_tokens: int = 0  # prompt tokens computed this step
    trace: TraceSample | None = None  # while tracing, once per interval


class EngineCoreReady(msgspec.Struct, tag="ready"):
    max_model_len: int


class UtilityResult(msgspec.Struct, tag="utility_result"):
    call_id: int
    result: SchedulerStats | bool | None = None
    error: str | None = None


class EngineCoreDead(msgspec.Struct, tag="dead"):
    reason: str
    bad_config: bool = False  # it could not start on these settings (a ValueError)


EngineCoreMessage = EngineCoreOutputs | EngineCoreReady | UtilityResult | EngineCoreDead


def seq_id(request_id: str, index: int, num_seqs: int) -> str:
    """The core's id of a sequence: the caller's id itself when it is the only one."""
    return request_id if num_seqs == 1 else f"{request_id}#{index}"


def resolve_max_tokens(max_tokens: int | None, num_prompt_tokens: int, max_model_len: int,
                       cap: int | None = None) -> int:
    """The one rule for a request's max_tokens, once its prompt fits (check_context_length).
    `cap`: the model's max_new_tokens (its generation config), which the server applies (vLLM
    does): it caps a given max_tokens, and is what None asks for while the prompt leaves room.
    Otherwise None asks for the rest of the context."""
    room = max_model_len - num_prompt_tokens
    if max_tokens is not None:
        return max_tokens if cap is None else min(max_tokens, cap)
    if cap is not None and room >= 1:
        return min(cap, room)
    return room


def make_core_request(request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                      max_model_len: int | None = None, *, max_tokens_cap: int | None = None,
                      arrival_time: float | None = None, **fields) -> EngineCoreRequest:
    """The request an edge (the server, the offline LLM, AsyncLLM / LLMEngine given a prompt)
    sends: sampling resolved once — max_tokens (resolve_max_tokens; max_model_len None: left
    to the core, for requests built without one), best_of's logprobs — and every other field
    (`fields`: priority, user, ...) as given. Given max_model_len, the edge has checked that
    the prompt fits (check_context_length: each edge once, the server naming the field)."""
    prompt_token_ids = list(prompt_token_ids)
    changes = {}
    if max_model_len is not None:
        max_tokens = resolve_max_tokens(params.max_tokens, len(prompt_token_ids),
                                        max_model_len, max_tokens_cap)
        if max_tokens != params.max_tokens:
            changes["max_tokens"] = max_tokens
    if (params.best_of or params.n) > params.n and params.logprobs is None:
        changes["logprobs"] = 0  # best_of ranks by logprob
    if changes:
        params = dataclasses.replace(params, **changes)
    return EngineCoreRequest(
        request_id=request_id, prompt_token_ids=prompt_token_ids, sampling_params=params,
        arrival_time=arrival_time if arrival_time is not None else time.time(), **fields)


def make_pooling_request(request_id: str, prompt_token_ids: list[int],
                         pooling_params: PoolingParams, *, arrival_time: float | None = None,
                         **fields) -> EngineCoreRequest:
    """A pooling request (embeddings): the core prefills and pools its prompt, samples
    nothing; its SamplingParams only say one sequence, one output when it finishes."""
    return EngineCoreRequest(
        request_id=request_id, prompt_token_ids=list(prompt_token_ids),
        sampling_params=SamplingParams(max_tokens=None,
                                       output_kind=RequestOutputKind.FINAL_ONLY),
        arrival_time=arrival_time if arrival_time is not None else time.time(),
        pooling_params=pooling_params, **fields)


def pack_logprobs(entry: dict[int, Logprob]) -> LogprobsLists:
    return list(entry), [lp.logprob for lp in entry.values()], [lp.rank for lp in entry.values()]


def unpack_logprobs(lists: LogprobsLists) -> dict[int, Logprob]:
    return {t: Logprob(lp, rank) for t, lp, rank in zip(*lists)}
