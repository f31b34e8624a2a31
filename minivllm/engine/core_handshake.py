"""The ready handshake with an engine core over its sockets (core_sockets.py): the core's
first message is EngineCoreReady, or EngineCoreDead when it could not start
(core_proc.start_engine_core). One wait for both clients that start a core elsewhere: MPClient
(a process of its own) and the replicas of DataParallelClient (Ray actors)."""

from __future__ import annotations

import time
from collections.abc import Callable

from minivllm.engine.core_sockets import CoreSockets
from minivllm.engine.messages import EngineCoreDead, EngineCoreReady


def wait_core_ready(sockets: CoreSockets, timeout: float, exited: Callable[[], str | None],
                    name: str) -> int:
    """Block until the core on `sockets` is ready; its max_model_len. ValueError for a
    setting it refused, RuntimeError when it failed to start, when `exited()` (asked while
    no message comes) says why it is gone, or when `name` did not start in `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sockets.poll(100):
            msg = sockets.recv_nowait()
            if isinstance(msg, EngineCoreDead):
                raise (ValueError if msg.bad_config else RuntimeError)(msg.reason)
            if isinstance(msg, EngineCoreReady):
                return msg.max_model_len
        elif (reason := exited()) is not None:
            raise RuntimeError(reason)
    raise RuntimeError(f"{name} did not start in {timeout:.0f}s")
