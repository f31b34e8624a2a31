"""The workload lab against a real minivllm server: `bench serve` accounts for every request,
and `bench policies` writes the seed-style comparison table and plots."""

import json

import pytest

from minivllm.cli import main
from tests.server_utils import FAST_ENGINE_ARGS, ServerProcess, stories_model

# A whole-system suite (bench policies starts a server per policy: ~2 minutes): `make
# test-e2e`, which CI runs beside `make test`, keeping `make test` under its 15 minutes.
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = ServerProcess(stories_model(), FAST_ENGINE_ARGS,
                         tmp_path_factory.mktemp("bench") / "server.log")
    yield proc
    proc.stop()


def test_bench_serve_accounts_for_every_request(server, tmp_path):
    out = tmp_path / "run"
    assert main(["bench", "serve", "--base-url", server.url, "--workload", "random",
                 "--num-prompts", "24", "--input-len", "20", "--output-len", "8",
                 "--request-rate", "40", "--max-concurrency", "8", "--output", str(out),
                 "--goodput", "ttft:5000", "tpot:1000", "--disable-tqdm"]) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["summary"]["completed"] == 24 and run["summary"]["failed"] == 0
    assert len(run["requests"]) == 24
    assert all(r["output_tokens"] == 8 for r in run["requests"])
    for name in ("summary.md", "ttft_cdf.png", "buckets.png"):
        assert (out / name).stat().st_size > 0


def test_bench_policies_smoke(tmp_path):
    out = tmp_path / "policies"
    assert main(["bench", "policies", "--model", str(stories_model()), "--workload", "seed-low",
                 "--num-prompts", "12", "--policies", "fcfs,sjf", "--num-kv-blocks", "96",
                 "--swap-space", "0.05", "--output", str(out), "--disable-tqdm"]) == 0
    table = (out / "comparison.md").read_text()
    assert "fcfs" in table and "sjf" in table
    for name in ("comparison.json", "comparison_ttft_cdf.png", "comparison_buckets.png"):
        assert (out / name).stat().st_size > 0
    summaries = json.loads((out / "comparison.json").read_text())["summaries"]
    assert all(s["completed"] == 12 and s["failed"] == 0 for s in summaries.values())
