"""CoreClient: the engine-core process as the API server sees it. It spawns the process
(core_proc.py), owns the two ZeroMQ sockets over IPC — inputs go out on a PUSH socket, the
core's messages come back on a PULL one — encodes and decodes the messages
(engine/messages.py), tells whether the process still lives, and stops it."""

from __future__ import annotations

import logging
import multiprocessing
import shutil
import tempfile
import time

import msgspec
import zmq
import zmq.asyncio

from minivllm.config import EngineConfig
from minivllm.engine.core_proc import run_engine_core
from minivllm.engine.messages import (
    EngineCoreDead,
    EngineCoreMessage,
    EngineCoreReady,
    EngineCoreShutdown,
)

logger = logging.getLogger(__name__)


def _log_format() -> tuple[int, str | None, str | None]:
    """Our logging level and format (the root handler's), for the core's lines to match."""
    root = logging.getLogger()
    formatter = root.handlers[0].formatter if root.handlers else None
    if formatter is None:
        return root.getEffectiveLevel(), None, None
    return root.getEffectiveLevel(), formatter._fmt, formatter.datefmt


class CoreClient:
    def __init__(self, config: EngineConfig, engine_threads: int | None) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(EngineCoreMessage)
        self._closed = False
        # The sockets are bound here; the core connects to them.
        self._ipc_dir = tempfile.mkdtemp(prefix="minivllm-")
        input_addr, output_addr = f"ipc://{self._ipc_dir}/input", f"ipc://{self._ipc_dir}/output"
        self._zmq = zmq.Context()
        self._input = self._zmq.socket(zmq.PUSH)
        self._input.setsockopt(zmq.SNDHWM, 0)  # a send never blocks the event loop
        self._input.bind(input_addr)
        self._output = self._zmq.socket(zmq.PULL)
        self._output.setsockopt(zmq.RCVHWM, 0)
        self._output.bind(output_addr)
        self._readable: zmq.asyncio.Socket | None = None  # the same socket, for awaiting
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

    # ---- messages -----------------------------------------------------------------------

    def encode(self, msg) -> bytes:
        """msgpack; OverflowError or msgspec.EncodeError for what it cannot carry."""
        return self._encoder.encode(msg)

    def send(self, msg) -> None:
        self.send_bytes(self.encode(msg))

    def send_bytes(self, data: bytes) -> None:
        try:
            self._input.send(data, flags=zmq.NOBLOCK)
        except zmq.ZMQError:  # the core is gone: its process's exit says so
            pass

    def recv_nowait(self) -> EngineCoreMessage | None:
        try:
            return self._decoder.decode(self._output.recv(flags=zmq.NOBLOCK))
        except zmq.Again:
            return None

    def poll(self, timeout_ms: int) -> bool:
        """Block until a message is here or timeout_ms passed."""
        return bool(self._output.poll(timeout_ms))

    async def wait_readable(self, timeout_ms: int) -> bool:
        """poll() for the event loop. Reads stay synchronous (recv_nowait): the messages
        that are already here are taken without a loop turn each."""
        if self._readable is None:
            self._readable = zmq.asyncio.Socket.from_socket(self._output)
        return bool(await self._readable.poll(timeout_ms))

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
