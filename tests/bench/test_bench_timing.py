"""minivllm/bench/timing.py: the one way benchmarks time things."""

from __future__ import annotations

import time

from minivllm.bench.timing import accumulating, alternating, call_seconds, ratio_summary, timed


def test_timed_returns_the_result_and_the_seconds():
    result, seconds = timed(lambda x, y=0: x + y, 2, y=3)
    assert result == 5 and 0 <= seconds < 1


def test_call_seconds_warms_up_then_repeats_until_enough_time_spent():
    calls = []
    times = call_seconds(lambda: calls.append(1), repeats=3, warmup=2)
    assert len(times) == 3 and len(calls) == 5
    times = call_seconds(lambda: time.sleep(0.01), repeats=1, warmup=0, min_seconds=0.05)
    assert len(times) >= 5 and sum(times) >= 0.05


def test_accumulating_adds_each_calls_seconds_even_when_it_raises():
    totals: dict[str, float] = {}

    def fail():
        time.sleep(0.01)
        raise ValueError

    slow = accumulating(totals, "x", lambda: time.sleep(0.01))
    slow()
    try:
        accumulating(totals, "x", fail)()
    except ValueError:
        pass
    assert totals["x"] >= 0.02


def test_alternating_runs_the_contenders_in_turn_each_round():
    order = []
    results = alternating({"a": lambda: order.append("a") or 1,
                           "b": lambda: order.append("b") or 2}, rounds=3)
    assert order == ["a", "b"] * 3 and results == {"a": [1, 1, 1], "b": [2, 2, 2]}


def test_ratio_summary_is_the_median_and_range():
    assert ratio_summary([1.0, 1.5, 1.2]) == "1.20x (1.00-1.50)"
    assert ratio_summary([0.9]) == "0.90x"
