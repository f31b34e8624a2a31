"""AsyncLLMEngine: many asyncio clients sharing one continuous batch, the whole LLMEngine
on a thread of the API server process (`minivllm serve --engine-mode thread`; the default
runs the engine core in a process of its own: async_llm.py, same public surface).

LLMEngine is not thread-safe, so one dedicated thread owns it: it drains an inbox of
add / abort commands, steps while there is work and sleeps on an event when idle. Each
request has its own asyncio.Queue, fed from that thread with loop.call_soon_threadsafe,
once per step for all of the step's outputs.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from minivllm.config import EngineConfig
from minivllm.engine.errors import EngineDeadError, EngineOverloadedError
from minivllm.engine.frontend import Frontend, request_error
from minivllm.engine.metrics import LoggingStatLogger, PrometheusStatLogger, StatLoggerBase
from minivllm.engine.request_stream import RequestStream, call_soon
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class _Add:
    request_id: str
    prompt: str | None
    params: SamplingParams
    prompt_token_ids: list[int] | None
    priority: int
    cache_salt: str | None
    oracle_output_len: int | None
    scheduling: dict  # user, ttft_slo_ms, e2e_slo_ms
    stream: RequestStream
    accepted: asyncio.Future


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Tracing:
    enabled: bool
    interval: float


def _resolve(future: asyncio.Future, error: BaseException | None) -> None:
    """Complete a future of another thread's loop (it may have been cancelled meanwhile)."""

    def complete() -> None:
        if future.done():
            return
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    call_soon(future.get_loop(), complete)


class AsyncLLMEngine(Frontend):
    def __init__(self, engine, stat_loggers: list[StatLoggerBase] | tuple = (),
                 log_interval: float = 5.0) -> None:
        super().__init__()
        self.engine = engine
        self.config: EngineConfig = engine.config
        self.max_model_len: int = engine.max_model_len
        # The HTTP side tokenizes on the event loop while the engine thread detokenizes:
        # a copy keeps the two from sharing one (not thread-safe) Rust tokenizer.
        self.tokenizer = copy.deepcopy(engine.tokenizer)
        for stat_logger in stat_loggers:
            engine.add_stat_logger(stat_logger)
        # The engine's own list: a logger added later (the dashboard's) is fed by its steps.
        self.stat_loggers = engine.stat_loggers
        self.log_interval = log_interval
        self.crashed = False  # the loop stopped because a step raised: restart the process
        self._inbox: deque[_Add | _Abort | _Tracing] = deque()
        self._lock = threading.Lock()  # guards _inbox, errored and draining
        self._wakeup = threading.Event()
        self._stopping = False
        self._stop_reason = "engine shut down"
        self._streams: dict[str, RequestStream] = {}  # engine thread only
        self._thread = threading.Thread(target=self._run, name="minivllm-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig, log_stats: bool = True,
                    log_interval: float = 5.0) -> AsyncLLMEngine:
        from minivllm.engine.llm_engine import LLMEngine  # loads torch: only when serving

        engine = LLMEngine(config)
        loggers: list[StatLoggerBase] = []
        if log_stats:
            loggers = [LoggingStatLogger(),
                       PrometheusStatLogger(config.model_name, engine.max_model_len)]
        return cls(engine, loggers, log_interval)

    # ---- asyncio side -------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self.errored

    async def generate(self, prompt: str | None, params: SamplingParams, request_id: str,
                       prompt_token_ids: list[int] | None = None, priority: int = 0,
                       cache_salt: str | None = None, oracle_output_len: int | None = None,
                       user: str | None = None, ttft_slo_ms: float | None = None,
                       e2e_slo_ms: float | None = None) -> AsyncIterator[RequestOutput]:
        """Yield the request's outputs, of its params.output_kind; the last one has
        finished=True.

        Raises ValueError for input the engine rejects, EngineOverloadedError when a queue
        bound is reached or the engine is draining, RequestFailedError (RequestTimeoutError)
        when the engine failed this request, EngineDeadError when the engine loop is gone. A
        consumer that stops early (disconnect, cancellation) aborts the request and frees its
        KV blocks.
        """
        loop = asyncio.get_running_loop()
        stream = RequestStream(loop, params.output_kind is RequestOutputKind.DELTA)
        accepted = loop.create_future()
        self._submit(_Add(request_id, prompt, params, prompt_token_ids, priority, cache_salt,
                          oracle_output_len, {"user": user, "ttft_slo_ms": ttft_slo_ms,
                                              "e2e_slo_ms": e2e_slo_ms}, stream, accepted))
        async with aclosing(self._outputs(request_id, stream, accepted)) as outputs:
            async for output in outputs:
                yield output

    def _abort(self, request_id: str) -> None:
        self._submit(_Abort(request_id), quiet=True)

    def set_tracing(self, enabled: bool, interval: float) -> None:
        """Request lifecycles and block maps for the stat loggers' record_trace."""
        self._submit(_Tracing(enabled, interval), quiet=True)

    async def drain(self, timeout: float) -> int:
        """Graceful shutdown: refuse new requests, give the ones in flight up to `timeout`
        seconds to finish, then stop the engine, which fails the rest with EngineDeadError.
        Returns how many were cut short."""
        with self._lock:
            self.draining = True
        cut = await self._wait_in_flight(timeout)
        await asyncio.to_thread(self.shutdown, "the server shut down before the request finished")
        return cut

    def shutdown(self, reason: str = "engine shut down") -> None:
        self._stop_reason = reason
        self._stopping = True
        self._wakeup.set()
        self._thread.join(timeout=10)

    def _submit(self, command: _Add | _Abort | _Tracing, quiet: bool = False) -> None:
        with self._lock:
            if self.errored:
                if quiet:
                    return
                raise EngineDeadError(f"the engine is not running ({self.dead_reason})")
            if self.draining and isinstance(command, _Add):
                self._count_rejected("shutdown")
                raise EngineOverloadedError("the server is shutting down", "shutdown")
            self._inbox.append(command)
        self._wakeup.set()

    # ---- engine thread ------------------------------------------------------------------

    def _run(self) -> None:
        next_log = time.monotonic() + self.log_interval
        try:
            while not self._stopping:
                self._process_inbox()
                # An abort leaves work too: its output and statistics come from the next step.
                if self.engine.has_unfinished_requests():
                    self._dispatch(self.engine.step())
                else:
                    self._wakeup.wait(timeout=max(next_log - time.monotonic(), 0.0))
                    self._wakeup.clear()
                if time.monotonic() >= next_log:
                    for stat_logger in self.stat_loggers:
                        stat_logger.log()
                    next_log = time.monotonic() + self.log_interval
        except Exception as e:
            logger.exception("engine loop failed: failing every in-flight request")
            self._die(f"engine loop failed: {type(e).__name__}: {e}", crashed=True)
        else:
            self._die(self._stop_reason, crashed=False)

    def _process_inbox(self) -> None:
        """Apply queued adds and aborts in order. One at a time: if the engine raises, the
        commands not yet applied are still in the inbox for _die() to fail."""
        while True:
            with self._lock:
                if not self._inbox:
                    return
                cmd = self._inbox.popleft()
            if isinstance(cmd, _Tracing):
                self.engine.set_tracing(cmd.enabled, cmd.interval)
                continue
            if isinstance(cmd, _Abort):
                if self._streams.pop(cmd.request_id, None) is not None:
                    self.engine.abort_request(cmd.request_id)
                    self.engine.flush_trace()  # no step may follow to report it
                continue
            if cmd.request_id in self._streams:
                _resolve(cmd.accepted, ValueError(f"request id {cmd.request_id!r} is in use"))
                continue
            try:
                self.engine.add_request(cmd.request_id, cmd.prompt, cmd.params,
                                        prompt_token_ids=cmd.prompt_token_ids,
                                        priority=cmd.priority, cache_salt=cmd.cache_salt,
                                        oracle_output_len=cmd.oracle_output_len,
                                        **cmd.scheduling)
            except Exception as e:  # ValueError for bad input; anything else is the caller's too
                if isinstance(e, EngineOverloadedError):
                    self._count_rejected(e.reason)
                _resolve(cmd.accepted, e)
                continue
            self._streams[cmd.request_id] = cmd.stream
            _resolve(cmd.accepted, None)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        items = []
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:  # aborted by its client: nobody is listening
                continue
            if output.finished or output.error is not None:
                del self._streams[output.request_id]
            items.append((stream, output if output.error is None
                          else request_error(output, self._count_rejected)))
        RequestStream.put_many(items)

    def _die(self, reason: str, crashed: bool) -> None:
        with self._lock:
            self.errored = True
            self.crashed = crashed
            self.dead_reason = reason
            pending = list(self._inbox)
            self._inbox.clear()
        error = EngineDeadError(reason)
        for cmd in pending:
            if isinstance(cmd, _Add):
                _resolve(cmd.accepted, error)
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()
