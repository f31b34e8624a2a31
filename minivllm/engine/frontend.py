"""The request plumbing the API server's engine clients share; each keeps only its own way to
the engine. Frontend: AsyncLLMEngine (the engine on a thread), AsyncLLM (one engine-core
process) and DataParallelAsyncLLM (engine-core replicas on Ray). CoreFrontend: the last two,
which tokenize, encode and detokenize on this side of the wire."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import msgspec

from minivllm.engine.errors import (
    EngineDeadError,
    EngineOverloadedError,
    RequestFailedError,
    RequestTimeoutError,
)
from minivllm.engine.messages import EngineCoreOutput, EngineCoreRequest, make_core_request
from minivllm.engine.request_stream import RequestStream
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import RequestOutputKind, SamplingParams

# An EngineCoreOutput's error_kind for a request the core turned away or failed.
TURNED_AWAY = ("invalid", "overloaded", "failed")


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


class Frontend:
    """generate()'s outputs, counted in flight for drain(), and abort(); a subclass sends
    the abort its own way (_abort)."""

    def __init__(self) -> None:
        self.errored = False  # the engine is gone, for whatever reason
        self.dead_reason: str | None = None
        self.draining = False  # shutting down: in-flight requests go on, new ones are refused
        self._num_in_flight = 0  # generate() calls not yet returned

    async def abort(self, request_id: str) -> None:
        self._abort(request_id)

    def _abort(self, request_id: str) -> None:
        raise NotImplementedError

    async def _outputs(self, request_id: str, stream: RequestStream,
                       accepted: asyncio.Future | None = None) -> AsyncIterator[RequestOutput]:
        """generate()'s outputs, after `accepted` (if given) says the engine took the request,
        until the finished one. A consumer that stops early (disconnect, cancellation) aborts
        the request: iterate under contextlib.aclosing, so that this happens when it leaves,
        not when the generator is collected."""
        self._num_in_flight += 1
        finished = False
        try:
            if accepted is not None:
                await accepted
            while not finished:
                output = await stream.get()
                finished = output.finished
                yield output
        finally:
            self._num_in_flight -= 1
            if not finished:
                self._abort(request_id)

    async def _wait_in_flight(self, timeout: float) -> int:
        """drain()'s wait: up to `timeout` seconds for the generate() calls in flight to
        return. Returns how many have not."""
        deadline = time.monotonic() + timeout
        while self._num_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self._num_in_flight

    def _count_rejected(self, reason: str) -> None:
        for stat_logger in self.stat_loggers:
            stat_logger.record_rejected(reason)


class CoreFrontend(Frontend):
    """A new request's checks, tokens, encoding and stream, for the clients of engine cores
    in other processes."""

    def __init__(self) -> None:
        super().__init__()
        self._crashed = False  # ... because it failed: the process should be restarted
        self._streams: dict[str, RequestStream] = {}

    def _open_request(self, prompt: str | None, params: SamplingParams, request_id: str,
                      prompt_token_ids: list[int] | None, **core_fields
                      ) -> tuple[EngineCoreRequest, bytes, RequestStream]:
        """A new request, if it may come in: as the core takes it (msgpack), and its stream,
        registered here and with the OutputProcessor. `core_fields` are EngineCoreRequest's
        other fields."""
        if self.errored:
            raise EngineDeadError(f"the engine is not running ({self.dead_reason})")
        if self.draining:
            self._count_rejected("shutdown")
            raise EngineOverloadedError("the server is shutting down", "shutdown")
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is in use")
        if prompt_token_ids is None:
            if prompt is None:
                raise ValueError("either prompt or prompt_token_ids is required")
            prompt_token_ids = self.tokenizer(prompt).input_ids
        request = make_core_request(request_id, prompt_token_ids, params, **core_fields)
        try:
            data = msgspec.msgpack.encode(request)
        except (OverflowError, msgspec.EncodeError) as e:  # JSON allows ints msgpack does not
            raise ValueError(f"a request field is out of range: {e}") from e
        stream = RequestStream(asyncio.get_running_loop(),
                               params.output_kind is RequestOutputKind.DELTA)
        self._processor.add_request(request, prompt, params)
        self._streams[request_id] = stream
        return request, data, stream
