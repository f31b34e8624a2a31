"""The token-level stop rule (vLLM V1's check_stop): whether a request's latest token ends it.

The one place the rule lives: Scheduler.update_from_output applies it to every request that
got a token, for the engine and the simulator alike. Stop strings need text, so they are the
OutputProcessor's, not this rule's.
"""

from __future__ import annotations

from collections.abc import Collection

from minivllm.core.request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int, eos_token_ids: Collection[int]
               ) -> RequestStatus | None:
    """The status that finishes the request after its latest token, or None if it goes on.
    EOS (unless ignore_eos) and the request's stop token ids stop it once it has min_tokens
    (a stop token also sets request.stop_reason); then max_tokens or the context length
    stop it by length. A request without sampling parameters (the simulator's, the
    scheduler tests') stops at EOS or by length."""
    params, outputs = request.sampling_params, request.output_token_ids
    token = outputs[-1]
    if params is None:
        if token in eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
    elif len(outputs) >= params.min_tokens:
        if not params.ignore_eos and token in eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if token in params.stop_token_ids:
            request.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
    if len(outputs) >= request.max_tokens or len(request.all_token_ids) >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None
