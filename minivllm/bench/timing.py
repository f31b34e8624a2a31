"""How benchmarks time things: one call, repeated calls, the time spent inside a function
over a run, and the contenders of a comparison in alternating rounds (A B A B ...), so that
whatever else loads the machine hits them alike, summed up as the median per-round ratio."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def timed(fn: Callable[..., T], *args, **kwargs) -> tuple[T, float]:
    """fn's result and the wall seconds the call took."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def call_seconds(fn: Callable[[], Any], repeats: int = 1, warmup: int = 1,
                 min_seconds: float = 0.0) -> list[float]:
    """The seconds of each call of fn after `warmup` untimed ones: `repeats` calls, more
    until `min_seconds` have been spent (fast calls then average over many)."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    while len(times) < repeats or sum(times) < min_seconds:
        times.append(timed(fn)[1])
    return times


def accumulating(totals: dict[str, float], key: str, fn: Callable[..., T]) -> Callable[..., T]:
    """fn, adding the seconds of each call to totals[key] (a wrapper to put in its place)."""
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] = totals.get(key, 0.0) + time.perf_counter() - start
    return wrapper


def alternating(contenders: dict[str, Callable[[], T]], rounds: int) -> dict[str, list[T]]:
    """Each contender called once per round, in turn; what each returned, round by round."""
    results: dict[str, list[T]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, run in contenders.items():
            results[name].append(run())
    return results


def ratio_summary(ratios: list[float]) -> str:
    """'1.23x (1.10-1.30)': the median per-round ratio and the range (one round: no range)."""
    spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
    return f"{statistics.median(ratios):.2f}x{spread}"
