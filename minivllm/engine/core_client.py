"""CoreClient: the engine-core process as the API server sees it. It spawns the process
(core_proc.py), binds the two ZeroMQ sockets (core_sockets.py) over IPC, tells whether the
process still lives, and stops it."""

from __future__ import annotations

import logging
import multiprocessing
import shutil
import tempfile
import time

from minivllm.config import EngineConfig
from minivllm.engine.core_proc import run_engine_core
from minivllm.engine.core_sockets import CoreSockets
from minivllm.engine.messages import EngineCoreDead, EngineCoreReady, EngineCoreShutdown

logger = logging.getLogger(__name__)


def _log_format() -> tuple[int, str | None, str | None]:
    """Our logging level and format (the root handler's), for the core's lines to match."""
    root = logging.getLogger()
    formatter = root.handlers[0].formatter if root.handlers else None
    if formatter is None:
        return root.getEffectiveLevel(), None, None
    return root.getEffectiveLevel(), formatter._fmt, formatter.datefmt


class CoreClient(CoreSockets):
    def __init__(self, config: EngineConfig, engine_threads: int | None) -> None:
        super().__init__()
        self._closed = False
        self._ipc_dir = tempfile.mkdtemp(prefix="minivllm-")
        input_addr, output_addr = f"ipc://{self._ipc_dir}/input", f"ipc://{self._ipc_dir}/output"
        self._input.bind(input_addr)
        self._output.bind(output_addr)
        self.proc = multiprocessing.get_context("spawn").Process(
            target=run_engine_core, name="minivllm-engine-core", daemon=True,
            args=(config, input_addr, output_addr, engine_threads, *_log_format()))
        try:
            self.proc.start()
        except BaseException:
            self._free()
            raise
        logger.info("engine core process started (pid %d)", self.proc.pid)

    def wait_ready(self, timeout: float) -> EngineCoreReady:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._output.poll(100):
                msg = self.recv_nowait()
                if isinstance(msg, EngineCoreDead):
                    raise (ValueError if msg.bad_config else RuntimeError)(msg.reason)
                if isinstance(msg, EngineCoreReady):
                    return msg
            elif not self.proc.is_alive():
                raise RuntimeError(f"the engine core process exited during startup (exit code "
                                   f"{self.proc.exitcode})")
        raise RuntimeError(f"the engine core did not start in {timeout:.0f}s")

    @property
    def alive(self) -> bool:
        return self.proc.is_alive()

    # ---- the end ------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the core (after what it is doing) and free the sockets; idempotent. Blocks
        up to 15 s: from the event loop, call it in a thread."""
        if self._closed:
            return
        self._closed = True
        if self.proc.is_alive():
            self.send(EngineCoreShutdown())
            self.proc.join(timeout=10)
            if self.proc.is_alive():  # it ignores SIGTERM (core_proc.py)
                self.proc.kill()
                self.proc.join(timeout=5)
        self._free()

    def _free(self) -> None:
        self._zmq.destroy(linger=0)
        shutil.rmtree(self._ipc_dir, ignore_errors=True)
