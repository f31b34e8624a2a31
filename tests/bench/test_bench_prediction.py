"""The length predictor's figures from a server's --length-prediction-log: Kendall tau over
every request and over the second half in finish order (held out from an online predictor's
cold start), and the table `bench policies` appends to comparison.md."""

from __future__ import annotations

from minivllm.bench.compare_policies import held_out_markdown
from minivllm.bench.prediction import describe, quality_from_log


def rows(pairs):
    return [{"predicted": p, "output_tokens": t, "queue_s": 0.1 * i}
            for i, (p, t) in enumerate(pairs)]


def test_held_out_is_the_second_half_in_finish_order():
    # cold start: the first half ranks backwards, the second half perfectly
    log = rows([(4, 1), (3, 2), (2, 3), (1, 4), (10, 10), (20, 20), (30, 30), (40, 40)])
    q = quality_from_log(log)
    assert q["n"] == 8 and q["held_out"]["n"] == 4
    assert q["held_out"]["kendall_tau"] == 1.0 and q["kendall_tau"] < 1.0
    assert abs(q["max_queue_s"] - 0.7) < 1e-9
    assert describe(q).endswith("second half (held out) tau 1.000 (n=4)")
    table = held_out_markdown({"sjf/probe": ({"length_prediction": q}, [])})
    assert "| sjf/probe | 8 |" in table and "| 4 | 1.000 |" in table


def test_an_odd_log_holds_out_the_larger_half_and_no_log_none():
    q = quality_from_log(rows([(1, 1), (2, 2), (3, 3)]))
    assert q["held_out"]["n"] == 2
    empty = quality_from_log([])
    assert empty["n"] == 0 and empty["held_out"]["n"] == 0 and describe(empty) == "no predictions"
