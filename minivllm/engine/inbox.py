"""Inbox: messages for a task on the event loop, put from another thread (the engine core's
busy loop on its thread: inproc_client.py), taken all at once; call_soon, to run something
on a loop from any thread."""

from __future__ import annotations

import asyncio
from collections import deque


def call_soon(loop: asyncio.AbstractEventLoop, callback, *args) -> None:
    """Run callback on a loop from any thread; a closed loop means nobody is listening."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass


class Inbox:
    def __init__(self) -> None:
        self._items: deque = deque()  # appends and pops are atomic: no lock
        self._loop: asyncio.AbstractEventLoop | None = None  # the reader's, once it waited
        self._waiter: asyncio.Future | None = None

    def put(self, item) -> None:
        """From any thread. Each put wakes the reader's loop once (a step's outputs are one
        item: one hand-off per step)."""
        self._items.append(item)
        loop = self._loop  # read after the append: a reader that set it will see the item
        if loop is not None:
            call_soon(loop, self._wake)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def peek(self) -> list:
        """What is waiting, left in place."""
        return list(self._items)

    async def take(self, timeout: float) -> list:
        """Everything put so far, after up to `timeout` seconds of waiting for something."""
        loop = self._loop = asyncio.get_running_loop()  # again: a later call may be on a new one
        if not self._items and timeout > 0:
            self._waiter = loop.create_future()
            timer = loop.call_later(timeout, self._wake)
            try:
                if not self._items:  # a put may have come before the waiter existed
                    await self._waiter
            finally:
                timer.cancel()
                self._waiter = None
        items = []
        while self._items:
            items.append(self._items.popleft())
        return items
