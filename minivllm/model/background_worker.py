"""One daemon thread working through a bounded queue of jobs, in order: the disk tier's
writer and prefetcher (model/kv_disk.py). A job that raises is logged and the thread goes
on; `drain` waits until every job submitted so far is done."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

_STOP = object()


class BackgroundWorker:
    def __init__(self, name: str, handle: Callable, max_queued: int) -> None:
        self._handle = handle
        self._queue: queue.Queue = queue.Queue(maxsize=max_queued)
        # A daemon: a process that exits without closing it (a crash) loses the queued
        # jobs, as a kill -9 would, and does not hang on them.
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job, wait: bool) -> bool:
        """Queue a job; when the queue is full, wait for room (`wait`) or return False."""
        try:
            self._queue.put(job, block=wait)
        except queue.Full:
            return False
        return True

    def drain(self) -> None:
        self._queue.join()

    def close(self) -> None:
        """Finish the queued jobs, then stop the thread."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is _STOP:
                    return
                self._handle(job)
            except Exception:  # a bug in a job must not stop the jobs after it
                logger.exception("%s: a job failed", self._thread.name)
            finally:
                self._queue.task_done()
