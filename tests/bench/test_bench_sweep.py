"""`bench sweep` against two fake OpenAI-compatible servers (test_bench_client's): every
point runs on every server --num-runs times, alternating, and the table, ratios, plot and
per-run reports come out."""

from __future__ import annotations

import json

import pytest

from minivllm.bench import sweep
from tests.bench.test_bench_client import FakeServer, bench


def test_sweep_alternates_servers_and_reports_every_point(tmp_path, capsys):
    a, b = FakeServer(), FakeServer()
    with a as url_a, b as url_b:
        rc = bench("sweep", "--server", f"fast={url_a}", "--server", f"other={url_b}",
                   "--request-rates", "100", "400", "--num-runs", "3", "--num-prompts", "14",
                   "--num-warmups", "2", "--pause", "0",
                   "--input-len", "20", "--output-len", "5", "--goodput", "ttft:1000",
                   "tpot:100", "--output", str(tmp_path), "--disable-tqdm")
    # the fake servers fail some prompts on purpose (test_bench_client): every run still
    # completes the others
    assert rc == 0
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert doc["points"] == ["100", "400"] and doc["knob"] == "request_rate"
    # per point: A B, B A, A B
    assert doc["order"] == [[n, p, r] for p in ("100", "400") for r, names in
                            enumerate([("fast", "other"), ("other", "fast"), ("fast", "other")],
                                      start=1) for n in names]
    # each server saw 2 warm-up requests, then the same trace: 14 requests a run, 2 points x
    # 3 runs, each run's prompts its own (no prefix-cache hits from an earlier run), the
    # same for both servers
    assert len(a.record) == len(b.record) == 2 + 14 * 6
    prompts_a = {tuple(r["prompt"]) for r in a.record}
    assert prompts_a == {tuple(r["prompt"]) for r in b.record}
    assert len(prompts_a) == 2 + 14 * 6
    for name in ("fast", "other"):
        for point in ("100", "400"):
            cell = doc["table"][name][point]
            assert cell["out tok/s"]["min"] <= cell["out tok/s"]["median"] <= cell["out tok/s"]["max"]
            assert cell["goodput req/s"] is not None
            runs = [doc["runs"][f"{name}@{point}"]]
            assert len(runs[0]) == 3
            for run in (1, 2, 3):
                assert (tmp_path / name / f"request_rate-{point}" / f"run-{run}" / "run.json").exists()
    md = (tmp_path / "sweep.md").read_text()
    assert "| fast | 100 |" in md and "| other | 400 |" in md
    assert "Ratios against fast" in md and "load average" in md
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
    assert "sweep written to" in capsys.readouterr().out


def test_concurrency_sweep_limits_requests_in_flight(tmp_path, monkeypatch):
    pauses = []
    monkeypatch.setattr(sweep, "sleep", pauses.append)
    server = FakeServer()
    with server as url:
        rc = bench("sweep", "--server", f"one={url}", "--max-concurrencies", "1", "4",
                   "--num-runs", "1", "--num-warmups", "0", "--num-prompts", "8", "--input-len", "20",
                   "--output-len", "4", "--output", str(tmp_path), "--disable-tqdm")
    assert rc == 0
    assert pauses == [2.0, 2.0]  # idle before each run: a server's tail stays out of the next
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert doc["knob"] == "max_concurrency" and doc["points"] == ["1", "4"]
    one = json.loads((tmp_path / "one" / "max_concurrency-1" / "run-1" / "run.json").read_text())
    assert one["meta"]["max_concurrency"] == 1
    spans = sorted((r["start"], r["start"] + r["e2e"]) for r in one["requests"] if r["success"])
    # with one request in flight, each starts after the one before it ended
    assert all(later[0] >= earlier[1] - 1e-3 for earlier, later in zip(spans, spans[1:]))


@pytest.mark.parametrize("argv,message", [
    (["--server", "nourl"], "--server must be NAME=http://HOST:PORT"),
    (["--server", "a=http://x", "--server", "a=http://y"], "given twice"),
    (["--server", "a=http://x", "--num-runs", "0"], "--num-runs must be at least 1"),
    (["--server", "a=http://x", "--pause", "-1"], "--pause must be at least 0"),
    (["--server", "a=http://x", "--goodput", "ttft"], "goodput SLO must be"),
])
def test_bad_sweep_arguments_are_named(argv, message):
    with pytest.raises((SystemExit, ValueError), match=message):
        bench("sweep", "--request-rates", "1", *argv)


def test_ratio_table_reads_latencies_as_reference_over_theirs():
    cell = {c: None for c, _, _ in sweep.FIGURES}
    fast = {**cell, "out tok/s": {"median": 200, "min": 200, "max": 200},
            "TTFT p50 ms": {"median": 100, "min": 100, "max": 100}}
    slow = {**cell, "out tok/s": {"median": 100, "min": 100, "max": 100},
            "TTFT p50 ms": {"median": 400, "min": 400, "max": 400}}
    doc = {"header": "h", "knob": "request_rate", "points": ["1"], "num_runs": 1,
           "servers": {"fast": "u", "slow": "v"}, "slos_ms": {}, "workload": "random",
           "sampling": "greedy", "table": {"fast": {"1": fast}, "slow": {"1": slow}}}
    row = [line for line in sweep.markdown(doc).splitlines() if line.startswith("| slow | 1 |")][-1]
    # throughput 200 / 100 and TTFT p50 400 / 100: fast is ahead on both
    assert row.split(" | ")[2:4] == ["2.00x", "4.00x"]
