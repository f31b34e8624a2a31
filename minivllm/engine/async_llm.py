"""AsyncLLM: the API server's client of an engine core in its own process (core_proc.py),
with AsyncLLMEngine's public surface (generate / abort / drain / shutdown, is_running,
errored, crashed, dead_reason, draining, config, max_model_len, tokenizer, stat_loggers).

This process keeps what needs text — tokenization (the HTTP handlers), detokenization, stop
strings, RequestOutputs (an OutputProcessor) — and the statistics: the core sends each
step's token ids and SchedulerStats, the loggers and /metrics are fed here. Requests and
aborts go to the core through a CoreClient (core_client.py: the process and its ZeroMQ
sockets); one asyncio task reads the core's messages and feeds each request's stream, all
on the event loop, so nothing here needs a lock.

The core's death is noticed twice: its last message (EngineCoreDead, when a step raised),
and its process's exit (a kill, a crash in C), which is_running / crashed check on each
call — the server's shutdown loop asks every tick. Either way the requests in flight fail
with EngineDeadError, /health answers 503 and the server exits non-zero.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from transformers import AutoTokenizer

from minivllm.config import EngineConfig
from minivllm.engine.core_client import CoreClient
from minivllm.engine.errors import EngineDeadError
from minivllm.engine.frontend import TURNED_AWAY, CoreFrontend, request_error, turned_away_error
from minivllm.engine.messages import (
    EngineCoreAbort,
    EngineCoreDead,
    EngineCoreOutputs,
    EngineCoreTracing,
    EngineCoreUtility,
    UtilityResult,
)
from minivllm.engine.metrics import LoggingStatLogger, PrometheusStatLogger, StatLoggerBase
from minivllm.engine.output_processor import OutputProcessor
from minivllm.engine.stats import SchedulerStats
from minivllm.model.loader import resolve_model_path
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_STARTUP_TIMEOUT_S = 600.0  # loading a large model from a slow disk takes a while
_IDLE_POLL_MS = 1000  # while no message comes, the output task wakes this often to log stats


def _current_task() -> asyncio.Task | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no event loop runs here
        return None


class AsyncLLM(CoreFrontend):
    def __init__(self, config: EngineConfig, stat_loggers: list[StatLoggerBase] | tuple = (),
                 log_interval: float = 5.0, engine_threads: int | None = None) -> None:
        super().__init__()
        self.config = config
        # Downloaded here first (a hub id), so that the core finds the files in the cache.
        path = resolve_model_path(config.model, config.revision)
        tokenizer_path = resolve_model_path(config.tokenizer) if config.tokenizer else path
        self.stat_loggers = list(stat_loggers)
        self.log_interval = log_interval
        self._calls: dict[int, asyncio.Future] = {}  # utility calls waiting for their result
        self._call_ids = itertools.count()
        self._task: asyncio.Task | None = None
        self._stopped = False  # the core was stopped on purpose
        self._core = CoreClient(config, engine_threads)
        try:
            # One tokenizer for the HTTP handlers and the detokenizers: both run on the loop.
            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)  # while it loads
            self._processor = OutputProcessor(self.tokenizer)
            ready = self._core.wait_ready(_STARTUP_TIMEOUT_S)
        except BaseException:
            self._core.close()
            raise
        self.max_model_len = ready.max_model_len

    @classmethod
    def from_config(cls, config: EngineConfig, log_stats: bool = True, log_interval: float = 5.0,
                    engine_threads: int | None = None) -> AsyncLLM:
        loggers: list[StatLoggerBase] = []
        if log_stats:
            # max_model_len sizes the token histograms: known once the core has started.
            loggers = [LoggingStatLogger()]
        engine = cls(config, loggers, log_interval, engine_threads)
        if log_stats:
            engine.stat_loggers.append(PrometheusStatLogger(config.model_name,
                                                            engine.max_model_len))
        return engine

    # ---- state --------------------------------------------------------------------------

    def _check_process(self) -> None:
        """Notice a core process that has exited: with its last words (EngineCoreDead) if
        they are on their way, else as killed (a signal, a crash in C code)."""
        if self.errored or self._stopped or self._core.alive:
            return
        if self._core.poll(100):
            self._receive_all()
        self._die(f"the engine core process died unexpectedly (exit code "
                  f"{self._core.proc.exitcode})", crashed=True)

    @property
    def is_running(self) -> bool:
        self._check_process()
        return not self.errored

    @property
    def crashed(self) -> bool:
        self._check_process()
        return self._crashed

    # ---- requests -----------------------------------------------------------------------

    async def generate(self, prompt: str | None, params: SamplingParams, request_id: str,
                       prompt_token_ids: list[int] | None = None, priority: int = 0,
                       cache_salt: str | None = None, oracle_output_len: int | None = None,
                       user: str | None = None, ttft_slo_ms: float | None = None,
                       e2e_slo_ms: float | None = None) -> AsyncIterator[RequestOutput]:
        """As AsyncLLMEngine.generate: the request's outputs, the last with finished=True;
        ValueError, EngineOverloadedError, RequestFailedError (RequestTimeoutError) or
        EngineDeadError otherwise. A consumer that stops early aborts the request."""
        self._ensure_started()
        self._check_process()
        _, data, stream = self._open_request(
            prompt, params, request_id, prompt_token_ids, priority=priority,
            cache_salt=cache_salt, oracle_output_len=oracle_output_len, user=user,
            ttft_slo_ms=ttft_slo_ms, e2e_slo_ms=e2e_slo_ms)
        self._send_bytes(data)
        async with aclosing(self._outputs(request_id, stream)) as outputs:
            async for output in outputs:
                yield output

    def _abort(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is None:
            return
        self._processor.abort_requests([request_id])
        self._send(EngineCoreAbort([request_id]))

    async def get_stats(self) -> SchedulerStats:
        """The core's SchedulerStats now (a round trip)."""
        self._ensure_started()
        if self.errored:
            raise EngineDeadError(f"the engine is not running ({self.dead_reason})")
        call_id = next(self._call_ids)
        future = self._calls[call_id] = asyncio.get_running_loop().create_future()
        self._send(EngineCoreUtility(call_id, "get_stats"))
        return await future

    def set_tracing(self, enabled: bool, interval: float) -> None:
        """Ask the core for request lifecycles and block maps (stat loggers' record_trace)."""
        self._ensure_started()  # its answer may come before any request
        self._send(EngineCoreTracing(enabled, interval))

    def _send(self, msg) -> None:
        if not self.errored:
            self._core.send(msg)

    def _send_bytes(self, data: bytes) -> None:
        if not self.errored:
            self._core.send_bytes(data)

    # ---- the core's messages ------------------------------------------------------------

    def _ensure_started(self) -> None:
        """The output task, on the caller's loop (again if an earlier loop has ended)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._output_loop())

    async def _output_loop(self) -> None:
        next_log = time.monotonic() + self.log_interval
        while not self.errored:
            timeout = min(_IDLE_POLL_MS, max(0.0, next_log - time.monotonic()) * 1000)
            if await self._core.wait_readable(int(timeout)):
                self._receive_all()
            else:
                self._check_process()
            if time.monotonic() >= next_log:
                for stat_logger in self.stat_loggers:
                    stat_logger.log()
                next_log = time.monotonic() + self.log_interval

    def _receive_all(self) -> None:
        """Handle every message already here, without a wait (and a loop turn) for each."""
        while not self.errored and (msg := self._core.recv_nowait()) is not None:
            self._handle(msg)

    def _handle(self, msg) -> None:
        if isinstance(msg, EngineCoreOutputs):
            self._handle_outputs(msg)
        elif isinstance(msg, UtilityResult):
            future = self._calls.pop(msg.call_id, None)
            if future is not None and not future.done():
                if msg.error is not None:
                    future.set_exception(RuntimeError(msg.error))
                else:
                    future.set_result(msg.result)
        elif isinstance(msg, EngineCoreDead):
            logger.error("the engine core died: %s", msg.reason)
            self._die(msg.reason, crashed=True)

    def _handle_outputs(self, msg: EngineCoreOutputs) -> None:
        for out in msg.outputs:  # requests the core turned away
            if out.error_kind not in TURNED_AWAY:
                continue
            self._processor.discard(out.request_id)
            stream = self._streams.pop(out.request_id, None)
            error = turned_away_error(out, self._count_rejected)
            if stream is not None:
                stream.put_nowait(error)
        processed = self._processor.process_outputs(msg)
        if processed.stopped:
            self._send(EngineCoreAbort(processed.stopped, stopped=True))
        if processed.failed:
            self._send(EngineCoreAbort(processed.failed))
        for output in processed.request_outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:  # aborted by its client: nobody is listening
                continue
            if output.finished or output.error is not None:
                del self._streams[output.request_id]
            stream.put_nowait(output if output.error is None
                              else request_error(output, self._count_rejected))
        if msg.scheduler_stats is not None:
            for stat_logger in self.stat_loggers:
                stat_logger.record(msg.scheduler_stats, processed.iteration_stats)
        if msg.trace is not None:
            for stat_logger in self.stat_loggers:
                stat_logger.record_trace(msg.trace)

    # ---- the end ------------------------------------------------------------------------

    def _die(self, reason: str, crashed: bool) -> None:
        """Fail everything in flight; on the event loop (or once it has stopped)."""
        if self.errored:
            return
        self.errored, self._crashed, self.dead_reason = True, crashed, reason
        error = EngineDeadError(reason)
        for stream in self._streams.values():
            stream.put_nowait(error)
        self._streams.clear()
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error)
        self._calls.clear()
        task = self._task
        if task is not None and not task.done() and task is not _current_task():
            task.cancel()  # before _stop_core closes the socket it polls

    async def drain(self, timeout: float) -> int:
        """Graceful shutdown: refuse new requests, give the ones in flight up to `timeout`
        seconds to finish, then stop the core, failing the rest with EngineDeadError.
        Returns how many were cut short."""
        self.draining = True
        cut = await self._wait_in_flight(timeout)
        self._die("the server shut down before the request finished", crashed=False)
        if self._task is not None:  # cancelled by _die: let it leave the socket first
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.to_thread(self._stop_core)
        return cut

    def shutdown(self, reason: str = "engine shut down") -> None:
        self._die(reason, crashed=False)
        self._stop_core()

    def _stop_core(self) -> None:
        self._stopped = True
        self._core.close()
