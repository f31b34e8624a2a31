"""AsyncLLM: the API server's engine, one class over any EngineCoreClient (core_client.py):
the core on a thread of this process (--engine-mode thread), in a process of its own
(--engine-mode process, the default) or as data-parallel replicas on Ray
(--data-parallel-size N). Its surface: generate / abort / drain / shutdown, get_stats,
set_tracing, replica_states; is_running, errored, crashed, dead_reason, draining, config,
max_model_len, tokenizer, stat_loggers.

This side keeps what needs text — tokenization, detokenization, stop strings, RequestOutputs
(one OutputProcessor) — and the statistics: the core sends each step's token ids and
SchedulerStats, the loggers and /metrics are fed here. One asyncio task reads what the
client hands over and feeds each request's stream, all on the event loop, so nothing here
needs a lock.

The engine's death is noticed twice: the client raises EngineDeadError from get_outputs
(the core's last words, every replica gone), and the client's death() check (a killed
process), which is_running / crashed ask on each call — the server's shutdown loop asks
every tick. Either way the requests in flight fail with EngineDeadError, /health answers
503 and the server exits non-zero.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator

from transformers import AutoTokenizer

from minivllm.config import EngineConfig
from minivllm.core.scheduler_stats import SchedulerStats
from minivllm.engine.core_client import (
    STARTUP_TIMEOUT_S,
    EngineCoreClient,
    EngineOutputs,
    RequestsLost,
)
from minivllm.engine.errors import EngineDeadError, EngineOverloadedError, RequestFailedError
from minivllm.engine.frontend import (
    TURNED_AWAY,
    build_request,
    check_runner,
    process_outputs,
    request_error,
    turned_away_error,
)
from minivllm.engine.inproc_client import InprocClient
from minivllm.engine.messages import EngineCoreRequest
from minivllm.engine.mp_client import MPClient
from minivllm.engine.output_processor import OutputProcessor
from minivllm.engine.request_state import RequestGroup
from minivllm.engine.request_stream import RequestStream
from minivllm.engine.stat_loggers import StatLoggerBase
from minivllm.model.loader import resolve_model_path
from minivllm.outputs import EmbeddingRequestOutput, RequestOutput
from minivllm.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)

_IDLE_POLL_S = 1.0  # while nothing comes, the output task wakes this often (stats, death)


def _current_task() -> asyncio.Task | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no event loop runs here
        return None


def load_tokenizer(config: EngineConfig):
    path = resolve_model_path(config.model, config.revision)
    return AutoTokenizer.from_pretrained(resolve_model_path(config.tokenizer)
                                         if config.tokenizer else path)



def make_core_client(config: EngineConfig, engine_mode: str = "process",
                     engine_threads: int | None = None) -> EngineCoreClient:
    """The single-core client --engine-mode names: "process" or "thread"."""
    if engine_mode == "thread":
        return InprocClient(config, engine_threads)
    if engine_mode == "process":
        return MPClient(config, engine_threads)
    raise ValueError(f"unknown engine mode {engine_mode!r}: process or thread")


class AsyncLLM:
    def __init__(self, client: EngineCoreClient, config: EngineConfig,
                 stat_loggers: list[StatLoggerBase] | tuple = (), log_interval: float = 5.0,
                 tokenizer=None) -> None:
        """Takes over `client` (closed if this fails); `tokenizer`: loaded from config if
        not given."""
        self.config = config
        self.stat_loggers = list(stat_loggers)
        self.log_interval = log_interval
        self.errored = False  # the engine is gone, for whatever reason
        self.dead_reason: str | None = None
        self.draining = False  # shutting down: in-flight requests go on, new ones are refused
        self._crashed = False  # ... because it failed: the process should be restarted
        self._stopped = False  # the core was stopped on purpose
        self._num_in_flight = 0  # generate() calls not yet returned
        self._streams: dict[str, RequestStream] = {}
        self._task: asyncio.Task | None = None
        self._client = client
        try:
            # One tokenizer for the HTTP handlers and the detokenizers: both run on the loop.
            self.tokenizer = load_tokenizer(config) if tokenizer is None else tokenizer
            self._processor = OutputProcessor(self.tokenizer)
            self.max_model_len = client.wait_ready(STARTUP_TIMEOUT_S)
        except BaseException:
            client.close()
            raise

    @classmethod
    def from_config(cls, config: EngineConfig, log_stats: bool = True, log_interval: float = 5.0,
                    engine_threads: int | None = None, engine_mode: str = "process"
                    ) -> AsyncLLM:
        """A single engine core, where --engine-mode says."""
        # Downloaded here first (a hub id), so that the core finds the files in the cache.
        resolve_model_path(config.model, config.revision)
        client = make_core_client(config, engine_mode, engine_threads)
        return cls.from_client(client, config, log_stats, log_interval)

    @classmethod
    def from_client(cls, client: EngineCoreClient, config: EngineConfig, log_stats: bool = True,
                    log_interval: float = 5.0) -> AsyncLLM:
        engine = cls(client, config, log_interval=log_interval)
        if log_stats:  # max_model_len sizes the token histograms: known once the core is up
            engine.stat_loggers += client.make_stat_loggers(config.model_name,
                                                           engine.max_model_len)
        return engine

    # ---- state --------------------------------------------------------------------------

    def _check_engine(self) -> None:
        """Notice an engine that went without a word (a killed core process)."""
        if self.errored or self._stopped:
            return
        reason = self._client.death()
        if reason is not None:
            self._die(reason, crashed=True)

    @property
    def is_running(self) -> bool:
        self._check_engine()
        return not self.errored

    @property
    def crashed(self) -> bool:
        self._check_engine()
        return self._crashed

    def replica_states(self) -> list[dict]:
        """For /health: each data-parallel replica's state; empty with one engine core."""
        return self._client.replica_states()

    def requests_in_flight(self) -> list[RequestGroup]:
        """The requests this front end is serving, oldest first, as the OutputProcessor
        keeps them (prompt, sequences so far, metrics): llama-server's /slots reads them."""
        return list(self._processor.groups.values())

    # ---- requests -----------------------------------------------------------------------

    async def generate(self, prompt: str | EngineCoreRequest | None, params: SamplingParams,
                       request_id: str, prompt_token_ids: list[int] | None = None,
                       priority: int = 0, prompt_text: str | None = None
                       ) -> AsyncIterator[RequestOutput]:
        """Yield the request's outputs, of its params.output_kind; the last one has
        finished=True.

        As vLLM's: `prompt` is the text (or None with prompt_token_ids), or an
        EngineCoreRequest an edge built (make_core_request: the server's, or a caller that
        sets more per-request fields: user, deadlines, cache_salt, ...), whose text, if any,
        is `prompt_text`. `params` are the caller's sampling parameters either way.

        Raises ValueError for input the engine rejects, EngineOverloadedError when a queue
        bound is reached or the engine is draining, RequestFailedError (RequestTimeoutError)
        when the engine failed this request, EngineDeadError when the engine is gone. A
        consumer that stops early (disconnect, cancellation) aborts the request and frees its
        KV blocks: iterate under contextlib.aclosing, so that this happens when it leaves,
        not when the generator is collected.
        """
        self._ensure_started()
        self._check_engine()
        stream = self._open_request(prompt, params, request_id, prompt_token_ids, priority,
                                    prompt_text)
        self._num_in_flight += 1
        finished = False
        try:
            while not finished:
                output = await stream.get()
                finished = output.finished
                yield output
        finally:
            self._num_in_flight -= 1
            if not finished:
                self._abort(request_id)

    def encode(self, request: EngineCoreRequest, prompt_text: str | None = None
               ) -> AsyncIterator[EmbeddingRequestOutput]:
        """A pooling request (messages.make_pooling_request): its one output, the pooled
        vector, through the same path, scheduler and errors as generate()."""
        return self.generate(request, request.sampling_params, request.request_id,
                             prompt_text=prompt_text)

    def _open_request(self, prompt: str | EngineCoreRequest | None, params: SamplingParams,
                      request_id: str, prompt_token_ids: list[int] | None, priority: int,
                      prompt_text: str | None) -> RequestStream:
        """A new request, if it may come in: sent to the core, its stream registered here
        and with the OutputProcessor."""
        if self.errored:
            raise EngineDeadError(f"the engine is not running ({self.dead_reason})")
        if self.draining:
            self._count_rejected("shutdown")
            raise EngineOverloadedError("the server is shutting down", "shutdown")
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is in use")
        request, prompt = build_request(prompt, params, request_id, prompt_token_ids,
                                        priority, prompt_text, self.tokenizer)
        check_runner(request, self.config.model_config)
        self._client.add_request(request)  # nothing is answered before the loop reads it
        stream = RequestStream(params.output_kind is RequestOutputKind.DELTA)
        self._processor.add_request(request, prompt, params)
        self._streams[request_id] = stream
        return stream

    async def abort(self, request_id: str) -> None:
        self._abort(request_id)

    def _abort(self, request_id: str) -> None:
        if request_id not in self._streams:
            return
        self._processor.abort_requests([request_id])
        if not self.errored:
            self._client.abort_requests([request_id])
        self._end(request_id)

    def _end(self, request_id: str) -> RequestStream | None:
        """The request is over here: its stream (if still open) leaves, the client forgets."""
        self._client.release([request_id])
        return self._streams.pop(request_id, None)

    async def get_stats(self) -> SchedulerStats:
        """The engine's SchedulerStats now (a round trip; under data parallel, the replicas'
        last reports added up)."""
        self._ensure_started()
        if self.errored:
            raise EngineDeadError(f"the engine is not running ({self.dead_reason})")
        return await self._client.get_stats()

    async def reset_prefix_cache(self, reset_external: bool = False) -> bool:
        """Forget the prefix cache, and with `reset_external` delete the disk tier's block
        files (EngineCore.reset_prefix_cache): POST /reset_prefix_cache."""
        self._ensure_started()
        if self.errored:
            raise EngineDeadError(f"the engine is not running ({self.dead_reason})")
        return await self._client.reset_prefix_cache(reset_external)

    def set_tracing(self, enabled: bool, interval: float) -> None:
        """Ask the core for request lifecycles and block maps (stat loggers' record_trace)."""
        self._ensure_started()  # its answer may come before any request
        if not self.errored:
            self._client.set_tracing(enabled, interval)

    def _count_rejected(self, reason: str, engine_idx: int = 0) -> None:
        for stat_logger in self.stat_loggers:
            stat_logger.record_rejected(reason, engine_idx=engine_idx)

    # ---- the engine's outputs -----------------------------------------------------------

    def _ensure_started(self) -> None:
        """The output task, on the caller's loop (again if an earlier loop has ended)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._output_loop())

    async def _output_loop(self) -> None:
        next_log = time.monotonic() + self.log_interval
        while not self.errored:
            timeout = min(_IDLE_POLL_S, max(0.0, next_log - time.monotonic()))
            try:
                events = await self._client.get_outputs(timeout)
            except EngineDeadError as e:
                logger.error("the engine core died: %s", e)
                self._die(str(e), crashed=True)
                return
            for event in events:
                if isinstance(event, EngineOutputs):
                    self._handle_outputs(event)
                elif isinstance(event, RequestsLost):
                    self._fail_lost(event)
            if not events:
                self._check_engine()
            if time.monotonic() >= next_log:
                for stat_logger in self.stat_loggers:
                    stat_logger.log()
                next_log = time.monotonic() + self.log_interval

    def _handle_outputs(self, event: EngineOutputs) -> None:
        msg, engine_idx = event.outputs, event.engine_index
        count_rejected = functools.partial(self._count_rejected, engine_idx=engine_idx)
        for out in msg.outputs:  # requests the core turned away
            if out.error_kind not in TURNED_AWAY:
                continue
            self._processor.discard(out.request_id)
            stream = self._end(out.request_id)
            error = turned_away_error(out, count_rejected)
            if stream is not None:
                stream.put(error)
        processed = process_outputs(self._processor, msg, self._client)
        for output in processed.request_outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:  # aborted by its client: nobody is listening
                continue
            if output.finished or output.error is not None:
                self._end(output.request_id)
            stream.put(output if output.error is None else request_error(output, count_rejected))
        if msg.scheduler_stats is not None:
            for stat_logger in self.stat_loggers:
                stat_logger.record(msg.scheduler_stats, processed.iteration_stats,
                                   engine_idx=engine_idx)
        if msg.trace is not None:
            for stat_logger in self.stat_loggers:
                stat_logger.record_trace(msg.trace, engine_idx=engine_idx)

    def _fail_lost(self, event: RequestsLost) -> None:
        for request_id in event.request_ids:
            self._processor.discard(request_id)
            stream = self._end(request_id)
            if stream is not None:
                stream.put(RequestFailedError(event.reason))

    # ---- the end ------------------------------------------------------------------------

    async def _wait_in_flight(self, timeout: float) -> int:
        """drain()'s wait: up to `timeout` seconds for the generate() calls in flight to
        return. Returns how many have not."""
        deadline = time.monotonic() + timeout
        while self._num_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self._num_in_flight

    def _die(self, reason: str, crashed: bool) -> None:
        """Fail everything in flight; on the event loop (or once it has stopped)."""
        if self.errored:
            return
        self.errored, self._crashed, self.dead_reason = True, crashed, reason
        error = EngineDeadError(reason)
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()
        task = self._task
        if task is not None and not task.done() and task is not _current_task():
            task.cancel()  # before the client closes what it waits on

    async def drain(self, timeout: float) -> int:
        """Graceful shutdown: refuse new requests, give the ones in flight up to `timeout`
        seconds to finish, then stop the engine, failing the rest with EngineDeadError.
        Returns how many were cut short."""
        self.draining = True
        cut = await self._wait_in_flight(timeout)
        self._die("the server shut down before the request finished", crashed=False)
        if self._task is not None:  # cancelled by _die: let it leave the client first
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.to_thread(self._stop_core)
        return cut

    def shutdown(self, reason: str = "engine shut down") -> None:
        self._die(reason, crashed=False)
        self._stop_core()

    def _stop_core(self) -> None:
        self._stopped = True
        self._client.close()
