"""MPClient (--engine-mode process, the default): the engine core in a process of its own
(core_proc.run_engine_core), over two ZeroMQ sockets and msgpack (core_sockets.py)."""

from __future__ import annotations

import logging
import multiprocessing
import shutil
import tempfile

import msgspec

from minivllm.config import EngineConfig
from minivllm.engine.core_client import SingleCoreClient, log_format
from minivllm.engine.core_handshake import wait_core_ready
from minivllm.engine.core_proc import run_engine_core
from minivllm.engine.core_sockets import CoreSockets
from minivllm.engine.errors import EngineDeadError
from minivllm.engine.messages import EngineCoreDead, EngineCoreRequest, EngineCoreShutdown

logger = logging.getLogger(__name__)


class MPClient(SingleCoreClient):
    """The engine core in a process of its own (core_proc.run_engine_core), spawned here, on
    two ZeroMQ sockets bound here over IPC. Its death is noticed twice: its last message
    (EngineCoreDead, when a step raised) and its process's exit (a kill, a crash in C)."""

    def __init__(self, config: EngineConfig, engine_threads: int | None) -> None:
        super().__init__()
        self.sockets = CoreSockets()
        self._closed = False
        self._ipc_dir = tempfile.mkdtemp(prefix="minivllm-")
        input_addr, output_addr = f"ipc://{self._ipc_dir}/input", f"ipc://{self._ipc_dir}/output"
        self.sockets.bind(input_addr, output_addr)
        self.proc = multiprocessing.get_context("spawn").Process(
            target=run_engine_core, name="minivllm-engine-core", daemon=True,
            args=(config, input_addr, output_addr, engine_threads, *log_format()))
        try:
            self.proc.start()
        except BaseException:
            self._free()
            raise
        logger.info("engine core process started (pid %d)", self.proc.pid)

    def wait_ready(self, timeout: float) -> int:
        return wait_core_ready(self.sockets, timeout, self._exit_reason, "the engine core")

    def _exit_reason(self) -> str | None:
        if self.proc.is_alive():
            return None
        return (f"the engine core process exited during startup (exit code "
                f"{self.proc.exitcode})")

    def add_request(self, request: EngineCoreRequest) -> None:
        try:
            data = self.sockets.encode(request)
        except (OverflowError, msgspec.EncodeError) as e:  # JSON allows ints msgpack does not
            raise ValueError(f"a request field is out of range: {e}") from e
        if not self._closed:
            self.sockets.send_bytes(data)

    def _send(self, msg) -> None:
        if not self._closed:
            self.sockets.send(msg)

    async def _receive(self, timeout: float) -> list:
        if not await self.sockets.wait_readable(int(timeout * 1000)):
            return []
        return self._recv_all()

    def _recv_all(self) -> list:
        """Every message already here, without a wait (and a loop turn) for each."""
        msgs = []
        while (msg := self.sockets.recv_nowait()) is not None:
            msgs.append(msg)
        return msgs

    def death(self) -> str | None:
        if self._closed or self.proc.is_alive():
            return None
        if self._dead is None and self.sockets.poll(100):  # its last words may be on the way
            for msg in self._recv_all():
                if isinstance(msg, EngineCoreDead):
                    self._dead = msg.reason
        reason = self._dead or (f"the engine core process died unexpectedly (exit code "
                                f"{self.proc.exitcode})")
        self._fail_calls(EngineDeadError(reason))
        return reason

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fail_calls(EngineDeadError("the engine core was stopped"))
        if self.proc.is_alive():
            self.sockets.send(EngineCoreShutdown())
            self.proc.join(timeout=10)
            if self.proc.is_alive():  # it ignores SIGTERM (core_proc.py)
                self.proc.kill()
                self.proc.join(timeout=5)
        self._free()

    def _free(self) -> None:
        self.sockets.close()
        shutil.rmtree(self._ipc_dir, ignore_errors=True)
