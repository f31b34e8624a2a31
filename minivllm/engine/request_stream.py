"""A request's outputs on their way from AsyncLLM's output task to the generate() call that
reads them, on the same event loop."""

from __future__ import annotations

import asyncio

from minivllm.outputs import RequestOutput


class RequestStream:
    """One request's outputs (or the error that ends it), read by get()."""

    def __init__(self, delta: bool) -> None:
        self._delta = delta  # outputs carry only what is new (RequestOutputKind.DELTA)
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    def put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

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
