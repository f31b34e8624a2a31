"""How the server process ends: drained on SIGTERM (exit 0), or at once when the engine has
crashed (exit 1, so that a supervisor restarts it) — never alive without generating."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import TYPE_CHECKING

import uvicorn

if TYPE_CHECKING:
    from minivllm.engine.async_llm import AsyncLLM

logger = logging.getLogger("minivllm.serve")

EXIT_ENGINE_DEAD = 1


class ServingServer(uvicorn.Server):
    """uvicorn's server with a graceful shutdown: the first SIGTERM (or SIGINT) makes the
    engine refuse new requests (503) while the listening socket stays open, gives the ones
    in flight `shutdown_timeout` seconds, aborts the rest (their clients get an error), then
    lets uvicorn close. A second signal exits at once."""

    def __init__(self, config: uvicorn.Config, engine: AsyncLLM,
                 shutdown_timeout: float) -> None:
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout = shutdown_timeout
        self.exit_code = 0
        self._signal: int | None = None
        self._drain: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame) -> None:
        if self._signal is not None:
            return super().handle_exit(sig, frame)  # uvicorn's: stop now, re-raise the signal
        self._signal = sig  # on_tick starts the drain, on the event loop

    async def on_tick(self, counter: int) -> bool:
        if self._signal is not None and self._drain is None:
            logger.info("%s: refusing new requests, %gs for those in flight to finish",
                        signal.Signals(self._signal).name, self.shutdown_timeout)
            self._drain = asyncio.ensure_future(self._drain_then_exit())
        if self.engine.crashed and not self.should_exit:
            logger.error("the engine has died (%s): exiting with status %d",
                         self.engine.dead_reason, EXIT_ENGINE_DEAD)
            self.exit_code = EXIT_ENGINE_DEAD
            self.should_exit = True
        return await super().on_tick(counter)

    async def _drain_then_exit(self) -> None:
        cut = await self.engine.drain(self.shutdown_timeout)
        if cut:
            logger.warning("shutdown timeout (%gs): aborted %d request(s) still in flight",
                           self.shutdown_timeout, cut)
        else:
            logger.info("every request in flight finished")
        self.should_exit = True
