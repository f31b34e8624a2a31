"""EngineCoreClient: how AsyncLLM (async_llm.py) reaches the engine core, whichever way it
runs. Three implementations, one protocol (vLLM V1's shape):

- InprocClient (inproc_client.py, --engine-mode thread): the core's busy loop on a thread of
  this process, on in-memory queues;
- MPClient (mp_client.py, --engine-mode process, the default): the core in a process of its own
  (core_proc.py), over two ZeroMQ sockets and msgpack (core_sockets.py);
- DataParallelClient (distributed/data_parallel.py, --data-parallel-size N): N engine-core
  replicas on Ray behind the router, their outputs merged into one stream.

A client carries EngineCoreRequests and aborts in, and the cores' EngineCoreOutputs out; it
never sees text. Everything else — tokens, the OutputProcessor, streams, stats — is
AsyncLLM's, written once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import Protocol

from minivllm.core.scheduler_stats import SchedulerStats
from minivllm.engine.errors import EngineDeadError
from minivllm.engine.inbox import call_soon
from minivllm.engine.messages import (
    EngineCoreAbort,
    EngineCoreDead,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineCoreTracing,
    EngineCoreUtility,
    UtilityResult,
)
from minivllm.engine.stat_loggers import LoggingStatLogger, PrometheusStatLogger, StatLoggerBase

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 600.0  # loading a large model from a slow disk takes a while


@dataclass
class EngineOutputs:
    """One step of one engine core (`engine_index`: its replica; 0 with a single core)."""

    outputs: EngineCoreOutputs
    engine_index: int = 0


@dataclass
class RequestsLost:
    """Requests whose engine died while running them (a data-parallel replica: the others
    go on). They fail with `reason`."""

    request_ids: list[str]
    reason: str


ClientEvent = EngineOutputs | RequestsLost


class EngineCoreClient(Protocol):
    """What AsyncLLM needs of the engine core(s). Called on the event loop."""

    def wait_ready(self, timeout: float) -> int:
        """Block until the core(s) can take requests; their max_model_len. Raises ValueError
        for a setting the core refused, RuntimeError when it failed to start."""

    def add_request(self, request: EngineCoreRequest) -> None:
        """Send a new request; ValueError for a field the transport cannot carry. What the
        core thinks of it comes back as its outputs (an error output if it turned it away)."""

    def abort_requests(self, request_ids: list[str], stopped: bool = False) -> None:
        """Stop requests (callers' ids) or sequences (seq_id()s) in the core; `stopped`: a
        stop string ended them (they count as finished, not aborted)."""

    def release(self, request_ids: list[str]) -> None:
        """The frontend is done with these requests (finished, failed, turned away, aborted):
        per-request state the client keeps goes."""

    async def get_outputs(self, timeout: float) -> list[ClientEvent]:
        """What the core(s) sent, waiting up to `timeout` seconds for something (an empty
        list then). Raises EngineDeadError when the engine has died."""

    def death(self) -> str | None:
        """Why the engine is gone if it went without a word (its process was killed), else
        None. Cheap: asked on every /health and every server tick."""

    async def get_stats(self) -> SchedulerStats:
        """The cores' SchedulerStats now; get_outputs() must be running to receive them."""

    async def reset_prefix_cache(self, reset_external: bool = False) -> bool:
        """Forget the prefix cache (EngineCore.reset_prefix_cache); get_outputs() must be
        running to receive the answer."""

    def set_tracing(self, enabled: bool, interval: float) -> None:
        """Ask the core(s) for request lifecycles and block maps (EngineCoreOutputs.trace)."""

    def replica_states(self) -> list[dict]:
        """For /health: each data-parallel replica's state, process id and why it last went
        down; empty with a single engine core."""

    def make_stat_loggers(self, model_name: str, max_model_len: int) -> list[StatLoggerBase]:
        """The stat loggers this client's engines are recorded by: the stats line and
        Prometheus; per replica under data parallel."""

    def close(self) -> None:
        """Stop the core(s) after what they are doing; idempotent. Blocks (seconds): from
        the event loop, call it in a thread."""


def single_engine_stat_loggers(model_name: str, max_model_len: int) -> list[StatLoggerBase]:
    return [LoggingStatLogger(), PrometheusStatLogger(model_name, max_model_len)]


class SingleCoreClient:
    """What the clients of one engine core share: inputs are messages, the core answers with
    messages; utility calls (get_stats) wait for their UtilityResult, EngineCoreDead ends
    it. A subclass moves the messages (_send, _receive)."""

    def __init__(self) -> None:
        self._calls: dict[int, asyncio.Future] = {}  # utility calls waiting for their result
        self._call_ids = itertools.count()
        self._dead: str | None = None  # the core's last words (EngineCoreDead)

    def _send(self, msg) -> None:
        raise NotImplementedError

    async def _receive(self, timeout: float) -> list:
        """The messages the core sent, after up to `timeout` seconds of waiting for one."""
        raise NotImplementedError

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send(request)

    def abort_requests(self, request_ids: list[str], stopped: bool = False) -> None:
        self._send(EngineCoreAbort(request_ids, stopped=stopped))

    def release(self, request_ids: list[str]) -> None:
        pass

    def set_tracing(self, enabled: bool, interval: float) -> None:
        self._send(EngineCoreTracing(enabled, interval))

    def replica_states(self) -> list[dict]:
        return []

    def make_stat_loggers(self, model_name: str, max_model_len: int) -> list[StatLoggerBase]:
        return single_engine_stat_loggers(model_name, max_model_len)

    async def get_stats(self) -> SchedulerStats:
        return await self._call("get_stats")

    async def reset_prefix_cache(self, reset_external: bool = False) -> bool:
        return await self._call("reset_prefix_cache", reset_external=reset_external)

    async def _call(self, method: str, **kwargs: bool):
        """A utility method of the core (core_proc.UTILITY_METHODS), answered in order."""
        call_id = next(self._call_ids)
        future = self._calls[call_id] = asyncio.get_running_loop().create_future()
        self._send(EngineCoreUtility(call_id, method, kwargs))
        return await future

    async def get_outputs(self, timeout: float) -> list[ClientEvent]:
        events = []
        for msg in await self._receive(timeout):
            if isinstance(msg, EngineCoreOutputs):
                events.append(EngineOutputs(msg))
            elif isinstance(msg, UtilityResult):
                self._resolve(msg)
            elif isinstance(msg, EngineCoreDead):
                self._dead = msg.reason
        if self._dead is not None:  # what came before it is answered first, then the end
            if events:
                return events
            self._fail_calls(EngineDeadError(self._dead))
            raise EngineDeadError(self._dead)
        return events

    def _resolve(self, msg: UtilityResult) -> None:
        future = self._calls.pop(msg.call_id, None)
        if future is not None and not future.done():
            if msg.error is not None:
                future.set_exception(RuntimeError(msg.error))
            else:
                future.set_result(msg.result)

    def _fail_calls(self, error: Exception) -> None:
        """From any thread (close() runs on drain's): each future fails on its own loop."""
        for future in self._calls.values():
            call_soon(future.get_loop(), _fail, future, error)
        self._calls.clear()


def _fail(future: asyncio.Future, error: Exception) -> None:
    if not future.done():
        future.set_exception(error)


def log_format() -> tuple[int, str | None, str | None]:
    """Our logging level and format (the root handler's), for the core's lines to match."""
    root = logging.getLogger()
    formatter = root.handlers[0].formatter if root.handlers else None
    if formatter is None:
        return root.getEffectiveLevel(), None, None
    return root.getEffectiveLevel(), formatter._fmt, formatter.datefmt
