"""InprocClient: the engine core in the API server's own process (`minivllm serve
--engine-mode thread`). Its busy loop (core_proc.run_busy_loop, the same one an engine-core
process runs) runs on a thread; inputs reach it on a queue and its messages come back in an
Inbox, as objects: nothing is encoded. The frontend's tokenizer is its own, so the HTTP side
and the core never share one (not thread-safe) Rust tokenizer."""

from __future__ import annotations

import logging
import queue
import threading

from minivllm.config import EngineConfig
from minivllm.engine.core_client import SingleCoreClient
from minivllm.engine.core_proc import run_busy_loop, start_engine_core
from minivllm.engine.errors import EngineDeadError
from minivllm.engine.inbox import Inbox
from minivllm.engine.messages import EngineCoreDead, EngineCoreInput, EngineCoreShutdown

logger = logging.getLogger(__name__)


class InprocClient(SingleCoreClient):
    def __init__(self, config: EngineConfig | None, engine_threads: int | None = None,
                 core=None) -> None:
        """The core starts here, on the caller's thread (loading the model), unless one is
        given (tests: a fake core)."""
        super().__init__()
        self._inputs: queue.SimpleQueue[EngineCoreInput] = queue.SimpleQueue()
        self._inbox = Inbox()
        self._closed = False
        if core is None:
            said: list = []  # EngineCoreReady, or EngineCoreDead with the reason
            core = start_engine_core(config, engine_threads, said.append)
            if core is None:
                dead = next(msg for msg in said if isinstance(msg, EngineCoreDead))
                raise (ValueError if dead.bad_config else RuntimeError)(dead.reason)
        self.core = core
        self._thread = threading.Thread(target=self._run, name="minivllm-engine", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float) -> int:
        return self.core.max_model_len  # it started in the constructor

    def _run(self) -> None:
        run_busy_loop(self.core, self._receive_input, self._inbox.put)

    def _receive_input(self, timeout_ms: int) -> EngineCoreInput | None:
        try:
            if timeout_ms == 0:
                return self._inputs.get_nowait()
            return self._inputs.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            return None

    def _send(self, msg) -> None:
        if not self._closed:
            self._inputs.put(msg)

    async def _receive(self, timeout: float) -> list:
        return await self._inbox.take(timeout)

    def death(self) -> str | None:
        if self._closed or self._thread.is_alive():
            return None
        # Its last words may not have been taken yet.
        said = [msg.reason for msg in self._inbox.peek() if isinstance(msg, EngineCoreDead)]
        reason = self._dead or (said[0] if said else "the engine thread exited")
        self._fail_calls(EngineDeadError(reason))
        return reason

    def close(self) -> None:
        if self._closed:
            return
        self._inputs.put(EngineCoreShutdown())
        self._closed = True
        self._fail_calls(EngineDeadError("the engine core was stopped"))
        self._thread.join(timeout=10)
