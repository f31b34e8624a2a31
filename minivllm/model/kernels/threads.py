"""Intra-op thread count that follows how busy the machine's other cores are.

With every core in use, OpenMP barriers are fast only while no other process wants those
cores: when one does, each parallel region waits for a descheduled thread and a step gets
many times slower (measured in docs/performance.md). So, every half second, this looks at
how much CPU time other processes took (/proc/stat minus our own) and runs on the cores
they left free. Where /proc/stat does not exist the thread count is left alone.
"""

from __future__ import annotations

import logging
import math
import os
import time

import torch

logger = logging.getLogger(__name__)

_INTERVAL_S = 0.5
_SLACK = 0.5  # a core counts as free if others used less than this much of it


def _busy_seconds() -> float | None:
    """CPU seconds every process has used on this machine (None without /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


class ThreadGovernor:
    def __init__(self, max_threads: int) -> None:
        self.max_threads = max_threads
        self.num_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        self._last = (time.monotonic(), _busy_seconds(), _own_seconds())

    def update(self) -> None:
        """Call once per step; resets torch's thread count at most every _INTERVAL_S."""
        now = time.monotonic()
        then, busy_then, own_then = self._last
        if busy_then is None or now - then < _INTERVAL_S:
            return
        busy, own = _busy_seconds(), _own_seconds()
        self._last = (now, busy, own)
        others = max(0.0, (busy - busy_then) - (own - own_then)) / (now - then)
        taken = max(0, math.ceil(others - _SLACK))  # cores other processes are using
        threads = max(1, min(self.max_threads, self.num_cpus - taken))
        if threads != torch.get_num_threads():
            logger.debug("other processes use %.2f cores: %d intra-op threads", others, threads)
            torch.set_num_threads(threads)
