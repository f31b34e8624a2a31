"""What every frontend does with the engine core's outputs, written once: AsyncLLM (the API
server, over any EngineCoreClient) and LLMEngine (offline, the core in the same call stack).

- process_outputs: the OutputProcessor's half of a step, and the rule that closes it — the
  core is told to stop the sequences a stop string ended (they count as finished) and to
  abort the requests that failed on this side (a detokenizer error, say).
- The errors a request raises when the core turned it away (TURNED_AWAY) or failed it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from minivllm.engine.errors import EngineOverloadedError, RequestFailedError, RequestTimeoutError
from minivllm.engine.messages import EngineCoreOutput, EngineCoreOutputs
from minivllm.engine.output_processor import OutputProcessor, ProcessedOutputs
from minivllm.outputs import RequestOutput

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
