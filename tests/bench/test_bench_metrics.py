"""Metric math on synthetic timings, and the report files."""

import json

import numpy as np
import pytest

from minivllm.bench.client import RequestResult
from minivllm.bench.metrics import (
    bucket_of,
    distribution,
    is_good,
    parse_goodput,
    summarize,
    tokens_per_s,
    tpot_ms,
)
from minivllm.bench.report import describe_changes, write_comparison, write_run


def done(prompt, out, ttft, e2e, i=0):
    itl = [(e2e - ttft) / (out - 1)] * (out - 1) if out > 1 else []
    return RequestResult(i, 1, None, prompt, out, 0.0, 0.0, ttft, e2e, itl, out, True)


def failed(prompt, i=0):
    return RequestResult(i, 2, None, prompt, 10, 0.0, error="HTTP 500: boom")


def test_tpot_and_tokens_per_s():
    r = done(100, 10, ttft=0.1, e2e=1.0)
    assert tpot_ms(r) == pytest.approx(100.0)
    assert tokens_per_s(r) == pytest.approx(10.0)
    assert tpot_ms(done(100, 1, 0.1, 0.1)) is None
    assert tpot_ms(failed(100)) is None and tokens_per_s(failed(100)) is None


def test_distribution_percentiles():
    d = distribution(range(1, 101))
    assert d == pytest.approx({"mean": 50.5, "median": 50.5, "p90": 90.1, "p99": 99.01})
    assert distribution([]) == {"mean": None, "median": None, "p90": None, "p99": None}


def test_buckets_use_scaled_seed_thresholds():
    seed = (500, 5000)
    assert [bucket_of(n, seed) for n in (499, 500, 5000, 5001)] == [
        "short", "medium", "medium", "long"]
    scaled = (500 / 16, 5000 / 16)
    assert [bucket_of(n, scaled) for n in (31, 32, 312, 313)] == [
        "short", "medium", "medium", "long"]


def test_goodput_parsing_and_checks():
    assert parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    assert parse_goodput(None) == {}
    for bad in (["ttft"], ["itl:5"], ["ttft:-1"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)
    slos = {"ttft": 500.0, "tpot": 50.0}
    assert is_good(done(10, 11, ttft=0.4, e2e=0.9), slos)  # TPOT 50 ms: on the limit
    assert not is_good(done(10, 11, ttft=0.6, e2e=0.9), slos)
    assert not is_good(done(10, 11, ttft=0.4, e2e=1.0), slos)
    assert not is_good(failed(10), slos)


def synthetic_results():
    rs = [done(10, 5, 0.1, 0.5, 0), done(20, 5, 0.2, 0.6, 1), done(100, 9, 1.0, 2.6, 2),
          done(400, 9, 3.0, 4.6, 3), failed(50, 4)]
    rs[1].output_tokens = 4  # the server sent fewer tokens than asked
    return rs


def test_summarize_counts_throughput_goodput_and_buckets():
    rs = synthetic_results()
    s = summarize(rs, duration=10.0, thresholds=(31.25, 312.5), slos={"ttft": 500.0})
    assert (s["total"], s["completed"], s["failed"]) == (5, 4, 1)
    assert s["output_length_mismatches"] == 1
    assert s["request_throughput"] == pytest.approx(0.4)
    assert s["output_token_throughput"] == pytest.approx((5 + 4 + 9 + 9) / 10)
    assert s["total_token_throughput"] == pytest.approx((530 + 27) / 10)
    assert s["goodput"] == pytest.approx(0.2)  # two requests under 500 ms TTFT
    assert s["ttft_ms"]["mean"] == pytest.approx(np.mean([100, 200, 1000, 3000]))
    assert s["tpot_ms"]["median"] == pytest.approx(np.median([100, 400 / 3, 200, 200]))
    assert s["e2el_ms"]["p99"] == pytest.approx(np.percentile([500, 600, 2600, 4600], 99))
    b = s["buckets"]
    assert (b["short"]["requests"], b["medium"]["requests"], b["long"]["requests"]) == (2, 1, 1)
    assert b["medium"]["failed"] == 1
    assert b["short"]["mean_prompt_tokens"] == 15
    assert b["long"]["ttft_ms"]["mean"] == pytest.approx(3000)
    assert b["medium"]["tpot_ms"]["mean"] == pytest.approx(200)
    assert summarize(rs, 10.0, (500, 5000))["goodput"] is None


def test_report_files(tmp_path):
    rs = synthetic_results()
    s = summarize(rs, 10.0, (31.25, 312.5))
    paths = write_run(tmp_path / "run", {"title": "synthetic"}, rs, s)
    names = {p.name for p in paths}
    assert names == {"run.json", "summary.md", "ttft_cdf.png", "buckets.png"}
    for p in paths:
        assert p.stat().st_size > 0
    doc = json.loads((tmp_path / "run" / "run.json").read_text())
    assert len(doc["requests"]) == 5 and doc["summary"]["failed"] == 1
    assert [r["bucket"] for r in doc["requests"]] == ["short", "short", "medium", "long", "medium"]
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "| TTFT (ms) |" in md and "short (< 31)" in md and "long (> 312)" in md

    slower = synthetic_results()
    for r in slower[:4]:
        r.ttft *= 2
        r.e2e *= 2
    runs = {"fcfs": (s, rs), "sjf": (summarize(slower, 12.0, (31.25, 312.5)), slower)}
    paths = write_comparison(tmp_path, {"title": "cmp"}, runs)
    assert {p.name for p in paths} == {"comparison.json", "comparison.md",
                                       "comparison_ttft_cdf.png", "comparison_buckets.png"}
    md = (tmp_path / "comparison.md").read_text()
    # a row in the policy table, then one per bucket table
    assert md.count("| fcfs |") == 4 and md.count("| sjf |") == 4
    assert "| run | completed | goodput (req/s) | mean E2E (s) |" in md
    text = describe_changes({p: v[0] for p, v in runs.items()})
    assert "sjf vs fcfs: short TTFT 0.15 -> 0.3 s (+100%), TPOT 117 -> 233 ms (+100%)" in text
    assert "lowest mean TTFT: short: fcfs" in text
