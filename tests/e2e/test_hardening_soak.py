"""Soak: 2,000 mixed requests, a fifth of whose clients leave early; nothing leaks.

The driver is minivllm/bench/soak.py (benchmarks/soak.py runs it longer, by hand). Tiny
max_tokens keep this one short; a small KV cache makes the batch preempt, and multi-sequence
requests (n > 1) are preempted by swapping, so both block pools are exercised.
"""

from __future__ import annotations

import asyncio

import httpx
import psutil
import pytest

from minivllm.bench.soak import make_requests, rss_mb, run_soak, wait_idle
from tests.server_utils import CHAT_TEMPLATE, FAST_ENGINE_ARGS, ServerProcess, stories_model

pytestmark = pytest.mark.e2e  # make test-e2e (also run by CI), not make test

NUM_REQUESTS = 2000
CONCURRENCY = 32  # twice --max-num-seqs: there is always a queue to leave from
MAX_RSS_GROWTH_MB = 32  # second half over the first (the first warms caches up)


def server_rss_mb(pid: int) -> float:
    """The server's and its children's: the engine core runs in one of them."""
    return rss_mb(pid) + sum(rss_mb(child.pid) for child in psutil.Process(pid).children())


def test_soak_frees_every_block_and_keeps_memory_flat(tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, "--max-num-seqs", "16",
                                             "--num-kv-blocks", "32",
                                             "--served-model-name", "stories",
                                             "--chat-template", str(template)],
                           tmp_path / "server.log")
    try:
        requests = make_requests(NUM_REQUESTS, seed=0, model="stories", max_tokens=4)
        half = NUM_REQUESTS // 2
        results, rss = [], []
        for part in (requests[:half], requests[half:]):
            results.append(asyncio.run(run_soak(server.url, part, CONCURRENCY)))
            wait_idle(server.url)  # all requests gone, every block free in both pools
            rss.append(server_rss_mb(server.proc.pid))
        statuses = results[0].statuses + results[1].statuses
        failures = results[0].failures + results[1].failures
        print(f"soak: {statuses}, {results[0].elapsed_s:.1f} s + {results[1].elapsed_s:.1f} s, "
              f"server RSS {rss[0]:.0f} -> {rss[1]:.0f} MiB")
        assert failures == []
        assert set(statuses) == {200, "disconnected"}
        assert statuses["disconnected"] >= 0.15 * NUM_REQUESTS
        metrics = server.metrics()
        assert metrics['vllm:request_success_total{finished_reason="abort"}'] > 0
        assert metrics["vllm:num_preemptions_total"] > 0
        assert rss[1] - rss[0] < MAX_RSS_GROWTH_MB
        # Alive, and still right.
        r = httpx.post(server.url + "/v1/completions", timeout=30, json={
            "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
        assert r.json()["choices"][0]["text"] == ", there was a little girl"
        assert "Traceback" not in server.log()
    finally:
        server.stop()
