"""What every frontend does with the engine core's outputs, written once: AsyncLLM (the API
server, over any EngineCoreClient) and LLMEngine (offline, the core in the same call stack).

- process_outputs: the OutputProcessor's half of a step, and the rule that closes it — the
  core is told to stop the sequences a stop string ended (they count as finished) and to
  abort the requests that failed on this side (a detokenizer error, say).
- The errors a request raises when the core turned it away (TURNED_AWAY) or failed it.
- build_request: vLLM's call form (a prompt, or an EngineCoreRequest an edge built) to the
  EngineCoreRequest sent to the core; check_runner: whether --runner lets it in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from minivllm.config import ModelConfig
from minivllm.engine.errors import (
    EngineOverloadedError,
    RequestFailedError,
    RequestTimeoutError,
    RunnerMismatchError,
)
from minivllm.engine.messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    make_core_request,
)
from minivllm.engine.output_processor import OutputProcessor, ProcessedOutputs
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams

# An EngineCoreOutput's error_kind for a request the core turned away or failed.
TURNED_AWAY = ("invalid", "overloaded", "failed")


class Aborts(Protocol):
    """An EngineCore, or an EngineCoreClient in front of one."""

    def abort_requests(self, request_ids: list[str], stopped: bool = False) -> None: ...


def process_outputs(processor: OutputProcessor, outputs: EngineCoreOutputs,
                    core: Aborts) -> ProcessedOutputs:
    """Turn a step's EngineCoreOutputs into RequestOutputs; the core stops what ended here.
    The core does not see text, so a stop string's end reaches it only this way (it may have
    generated a token or two more meanwhile: the OutputProcessor drops them)."""
    processed = processor.process_outputs(outputs)
    if processed.stopped:
        core.abort_requests(processed.stopped, stopped=True)
    if processed.failed:
        core.abort_requests(processed.failed)
    return processed


def turned_away_error(out: EngineCoreOutput, count_rejected: Callable[[str], None]) -> Exception:
    """What a request the core turned away (error_kind in TURNED_AWAY) raises."""
    if out.error_kind == "overloaded":
        count_rejected(out.overload_reason)
        return EngineOverloadedError(out.error, out.overload_reason)
    return (ValueError if out.error_kind == "invalid" else RequestFailedError)(out.error)


def request_error(output: RequestOutput, count_rejected: Callable[[str], None]
                  ) -> RequestFailedError:
    """What a request the engine failed (output.error) raises."""
    # The engine fails a request it never scheduled only when it waited too long.
    if output.metrics is not None and output.metrics.first_scheduled_time is None:
        count_rejected("request_timeout")
        return RequestTimeoutError(output.error)
    return RequestFailedError(output.error)


def build_request(prompt: str | EngineCoreRequest | None, params: SamplingParams,
                  request_id: str, prompt_token_ids: list[int] | None, priority: int,
                  prompt_text: str | None, tokenizer, arrival_time: float | None = None
                  ) -> tuple[EngineCoreRequest, str | None]:
    """The request to send and its prompt text, from vLLM's add_request arguments: an
    EngineCoreRequest as an edge built it (its request_id must be `request_id`), else one made
    here from the prompt (tokenized unless prompt_token_ids are given), priority and arrival
    time, whose max_tokens None the core resolves (the rest of the context) as it checks the
    prompt against the context."""
    if isinstance(prompt, EngineCoreRequest):
        if prompt.request_id != request_id:
            raise ValueError(f"request_id {request_id!r} is not the EngineCoreRequest's "
                             f"({prompt.request_id!r})")
        return prompt, prompt_text
    if prompt_token_ids is None:
        if prompt is None:
            raise ValueError("either prompt or prompt_token_ids is required")
        prompt_token_ids = tokenizer(prompt).input_ids
    return (make_core_request(request_id, prompt_token_ids, params, priority=priority,
                              arrival_time=arrival_time), prompt)


def check_runner(request: EngineCoreRequest, model_config: ModelConfig) -> None:
    """Refuse a request of the kind --runner (or --convert) turned off, before it reaches
    the core: a generation request on a pooling runner, a pooling request on a generate one."""
    runner = model_config.runner_type
    if runner == "auto" or (runner == "pooling") == (request.pooling_params is not None):
        return
    flags = f"--runner {model_config.runner}" + (
        f" --convert {model_config.convert}" if model_config.convert != "auto" else "")
    serves, refused = ("embeddings", "generation") if runner == "pooling" \
        else ("generation", "embeddings")
    raise RunnerMismatchError(
        f"this engine runs {flags}: it serves {serves} only, not {refused} requests "
        "(--runner auto with --convert auto, the defaults, serves both)")
