"""The plumbing between the engine's output streams and HTTP, which every endpoint shares:
awaiting a request's outputs (its first, its last, several at once, cancelling the rest on a
failure), merging several requests' streams, writing server-sent events, and aborting the
requests behind a response whose client went away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterable
from contextlib import aclosing

from fastapi import Request, Response
from starlette.responses import StreamingResponse

from minivllm.entrypoints.openai.errors import error_body, log_if_unexpected, to_openai_error
from minivllm.outputs import RequestOutput


async def gather_or_cancel(awaitables: Iterable[Awaitable]) -> list:
    """gather(), but a failure (or our own cancellation) cancels the siblings, which aborts them."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def last_output(gen: AsyncIterator[RequestOutput]) -> RequestOutput:
    async with aclosing(gen):
        last = None
        async for output in gen:
            last = output
        return last


async def first_outputs(gens: list[AsyncIterator[RequestOutput]]) -> list[RequestOutput]:
    """Each request's first output, awaited before a stream starts, so that the engine's
    rejections still become a 4xx status instead of an error inside a 200 stream."""
    try:
        return await gather_or_cancel(anext(gen) for gen in gens)
    except BaseException:
        for gen in gens:
            await gen.aclose()
        raise


async def merge_streams(gens: list[AsyncIterator[RequestOutput]],
                        firsts: list[RequestOutput]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Yield (index, output) from several requests as they come, after their first outputs.
    One task per request pumps its outputs into a shared queue; closing this generator
    cancels the pumps, which aborts the requests still running."""
    if len(gens) == 1:  # n=1, the common case: no pump task and no second queue per token
        yield 0, firsts[0]
        async with aclosing(gens[0]):
            async for output in gens[0]:
                yield 0, output
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, gen: AsyncIterator[RequestOutput]) -> None:
        async with aclosing(gen):
            try:
                async for output in gen:
                    queue.put_nowait((i, output))
            except Exception as e:  # the engine's error, raised to the reader below
                queue.put_nowait((i, e))
        queue.put_nowait((i, None))

    pumps = [asyncio.ensure_future(pump(i, gen)) for i, gen in enumerate(gens)]
    try:
        for i, first in enumerate(firsts):
            yield i, first
        running = len(gens)
        while running:
            i, item = await queue.get()
            if item is None:
                running -= 1
                continue
            if isinstance(item, Exception):
                raise item
            yield i, item
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


def sse(payload) -> str:
    return f"data: {payload.model_dump_json()}\n\n"


def sse_error(exc: Exception) -> str:
    """The event that ends a stream which failed after it started."""
    log_if_unexpected(exc)
    err = to_openai_error(exc)
    return sse(error_body(err.message, err.status, err.param))


SSE_DONE = "data: [DONE]\n\n"


class SSEResponse(StreamingResponse):
    """Server-sent events; however the response ends, its generator is closed at once, which
    aborts the requests behind it (a client that disconnected between two chunks, say)."""

    media_type = "text/event-stream"

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(request: Request, handler: Awaitable[Response]) -> Response:
    """Run a handler, cancelling it (and so aborting its requests) if the client leaves first,
    whether its request is still queued or already running."""
    work = asyncio.ensure_future(handler)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not work.done():
            work.cancel()
        await asyncio.gather(work, watcher, return_exceptions=True)
    if work.cancelled():  # the client is gone: nobody reads this
        return Response(status_code=499)
    return work.result()
