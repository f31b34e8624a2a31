"""A request's outputs on their way to the asyncio task that reads them: from the engine
thread (AsyncLLMEngine: put, put_many) or from the event loop itself (AsyncLLM: put_nowait)."""

from __future__ import annotations

import asyncio

from minivllm.outputs import RequestOutput


def call_soon(loop: asyncio.AbstractEventLoop, callback, *args) -> None:
    """Run callback on another thread's loop; a closed loop means nobody is listening."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass


class RequestStream:
    """One request's outputs, read by get() on the request's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delta: bool) -> None:
        self._loop = loop
        self._delta = delta  # outputs carry only what is new (RequestOutputKind.DELTA)
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    def put_nowait(self, item: RequestOutput | BaseException) -> None:
        """From the request's own event loop."""
        self._queue.put_nowait(item)

    def put(self, item: RequestOutput | BaseException) -> None:
        """From another thread."""
        call_soon(self._loop, self._queue.put_nowait, item)

    @staticmethod
    def put_many(items: list[tuple[RequestStream, RequestOutput | BaseException]]) -> None:
        """put() for a whole step's outputs, in one hand-off per event loop. Each hand-off
        wakes the loop, and a woken loop takes the GIL from the engine thread: one hand-off
        per request per step cost 5-8 % of the throughput in a controlled harness
        (docs/performance.md)."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for stream, item in items:
            by_loop.setdefault(stream._loop, []).append((stream._queue, item))
        for loop, pairs in by_loop.items():
            call_soon(loop, _put_all, pairs)

    async def get(self) -> RequestOutput:
        """The next output; a reader that fell behind gets what queued up as one: deltas
        folded together, or the newest of cumulative outputs."""
        item = await self._queue.get()
        while isinstance(item, RequestOutput) and not item.finished and not self._queue.empty():
            newer = self._queue.get_nowait()
            if isinstance(newer, BaseException):
                item = newer
            elif self._delta:
                item.add(newer)
            else:
                if newer.prompt_logprobs is None:
                    newer.prompt_logprobs = item.prompt_logprobs
                item = newer
        if isinstance(item, BaseException):
            raise item
        return item


def _put_all(pairs: list[tuple[asyncio.Queue, RequestOutput | BaseException]]) -> None:
    for queue, item in pairs:
        queue.put_nowait(item)
