"""`bench serve` reads the server's recompute tax and shed counts from /metrics, over its own
run: against a real minivllm server (edf shedding, a KV cache too small for the batch) they
match the server's counters; against a server without them (the fake OpenAI server) they are
None and the report says so."""

from __future__ import annotations

import json

import pytest

from minivllm.bench import server_metrics
from tests.bench.test_bench_client import FakeServer, bench
from tests.server_utils import SLOW_STEPS, ServerProcess, stories_model

pytestmark = pytest.mark.e2e  # make test-e2e (also run by CI): minutes of servers, kept out of make test

NUM = 24


@pytest.fixture(scope="module")
def tight_edf_server(tmp_path_factory):
    """edf with a 300 ms TTFT deadline and steps of 5 ms or more: of a burst of requests of
    40 output tokens, 4 at a time, the later ones are shed; 16 KV blocks of 4 tokens hold
    one request of 8 + 40 tokens (12 blocks) but not two: recompute preemption."""
    proc = ServerProcess(stories_model(), [
        "--scheduling-policy", "edf", "--ttft-slo-ms", "300", "--block-size", "4",
        "--num-kv-blocks", "16", "--swap-space", "0", "--max-num-seqs", "4",
        "--no-enable-prefix-caching"], tmp_path_factory.mktemp("metrics") / "server.log",
        prelude=SLOW_STEPS)
    yield proc
    proc.stop()


def run_bench(url: str, out) -> dict:
    bench("serve", "--base-url", url, "--workload", "random", "--num-prompts", str(NUM),
          "--input-len", "8", "--output-len", "40", "--output", str(out), "--disable-tqdm")
    return json.loads((out / "run.json").read_text())["summary"]


def test_bench_serve_reports_the_runs_recompute_tax_and_sheds(tight_edf_server, tmp_path):
    first = run_bench(tight_edf_server.url, tmp_path / "first")
    second = run_bench(tight_edf_server.url, tmp_path / "second")
    for summary in (first, second):
        server = summary["server_metrics"]
        assert server["recomputed_tokens"] > 0
        assert server["recompute_tax"] == server["recomputed_tokens"] / server["computed_tokens"]
        # every failure here is a shed request (HTTP 503 before its first token)
        assert server["requests_shed"] == summary["failed"] > 0
        assert server["requests_deprioritized"] == 0
    # each run counts only its own: the two add up to the server's totals
    totals = tight_edf_server.metrics()
    for field, name in (("computed_tokens", "minivllm:num_computed_tokens_total"),
                        ("recomputed_tokens", "minivllm:num_recomputed_tokens_total"),
                        ("requests_shed", "minivllm:num_requests_shed_total")):
        assert first["server_metrics"][field] + second["server_metrics"][field] == totals[name]
    text = (tmp_path / "second" / "summary.md").read_text()
    assert f"recompute tax {second['server_metrics']['recompute_tax']:.2%}" in text
    assert f"requests shed {second['failed']}, deprioritized 0" in text


def test_a_server_without_minivllms_counters_gives_none(tmp_path):
    with FakeServer() as url:  # no /metrics at all (404)
        summary = run_bench(url, tmp_path)
    assert summary["completed"] > 0 and summary["server_metrics"] is None
    assert "not a minivllm server" in (tmp_path / "summary.md").read_text()


def test_over_run_keeps_what_the_server_does_not_export():
    """vLLM exports none of these (None); an older minivllm only the recompute counters."""
    before = {"recomputed_tokens": 2.0, "computed_tokens": 50.0}
    after = {"recomputed_tokens": 5.0, "computed_tokens": 80.0}
    assert server_metrics.over_run(before, after) == {
        "recompute_tax": 0.1, "recomputed_tokens": 3, "computed_tokens": 30,
        "requests_shed": None, "requests_deprioritized": None}
    assert server_metrics.over_run(None, None) is None
    assert "requests shed -" in server_metrics.describe(server_metrics.over_run(None, after))
