"""The prefix cache's disk tier under a server: the dashboard's event stream carries its
figures (used bytes of capacity, block files, tokens loaded, bytes read and written,
evictions, corrupt files), and POST /reset_prefix_cache clears the prefix cache without a
restart -- memory only, or with ?reset_external=true the tier's files too; bad parameters
get a 400 naming them. (The reset's effect on running requests: tests/engine/
test_prefix_cache_reset.py.)"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server_utils import ServerProcess

ENGINE = ["--num-kv-blocks", "12", "--block-size", "4", "--max-num-seqs", "2",
          "--dashboard-interval", "0.2"]
PROMPT = list(range(5, 29))  # 24 tokens: 5 full blocks a hit may serve
FILLER = list(range(40, 80))  # with max_tokens, every block of the pool: PROMPT's go to disk
HITS = "vllm:prefix_cache_hits_total"


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kv_disk_tier_server")
    server = ServerProcess(tiny_llama, [*ENGINE, "--kv-offloading-backend", "disk",
                                        "--kv-offloading-path", str(tmp / "tier")],
                           tmp / "server.log")
    server.tier = tmp / "tier"
    yield server
    server.stop()


def complete(server: ServerProcess, prompt: list[int]) -> str:
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0}
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    response.raise_for_status()
    return response.json()["choices"][0]["text"]


def block_files(server: ServerProcess) -> list:
    return sorted(server.tier.glob("*/*.kv"))


def next_snapshot(server: ServerProcess) -> dict:
    """The first snapshot of a new event stream with the engine's stats (those before
    the core's first report have none: no tier either)."""
    with httpx.stream("GET", server.url + "/v1/engine/events", timeout=30) as response:
        snapshots = (json.loads(line[len("data: "):]) for line in response.iter_lines()
                     if line.startswith("data: ") and '"kv_disk"' in line)
        for _, snapshot in zip(range(25), snapshots):
            if snapshot["kv_disk"] is not None:
                return snapshot
    raise AssertionError("no snapshot showed the disk tier")


def test_the_event_stream_carries_the_disk_tier(server):
    complete(server, PROMPT)
    complete(server, FILLER)
    complete(server, PROMPT)  # loaded back from the tier
    disk = next_snapshot(server)["kv_disk"]
    metrics = server.metrics()
    files = block_files(server)
    assert disk["blocks"] == len(files) > 0
    assert disk["used_bytes"] == sum(f.stat().st_size for f in files)
    assert disk["capacity_bytes"] > disk["used_bytes"]
    assert disk["blocks"] == metrics["minivllm:kv_disk_blocks"]
    assert disk["used_bytes"] == metrics["minivllm:kv_disk_used_bytes"]
    assert disk["capacity_bytes"] == metrics["minivllm:kv_disk_capacity_bytes"]
    assert disk["hit_tokens"] == metrics["vllm:external_prefix_cache_hits_total"] > 0
    assert disk["bytes_written"] == metrics["minivllm:kv_disk_bytes_written_total"] > 0
    assert disk["bytes_read"] == metrics["minivllm:kv_disk_bytes_read_total"] > 0
    assert disk["evictions"] == disk["corrupt"] == 0


def test_reset_clears_memory_then_the_tier(server):
    expected = complete(server, PROMPT)
    assert httpx.post(server.url + "/reset_prefix_cache", timeout=30).status_code == 200
    before = server.metrics()
    assert complete(server, PROMPT) == expected
    after = server.metrics()
    # memory forgot PROMPT; the tier still had it, and served all of its hits
    loaded = "vllm:external_prefix_cache_hits_total"
    assert after[HITS] - before[HITS] == after[loaded] - before[loaded] > 0

    response = httpx.post(server.url + "/reset_prefix_cache",
                          params={"reset_external": "true"}, timeout=30)
    assert response.status_code == 200
    assert block_files(server) == []
    assert next_snapshot(server)["kv_disk"]["blocks"] == 0
    before = server.metrics()
    assert complete(server, PROMPT) == expected
    after = server.metrics()
    assert after[HITS] == before[HITS] and after[loaded] == before[loaded]  # recomputed


@pytest.mark.parametrize("params, param", [
    ({"reset_external": "maybe"}, "reset_external"),
    ({"reset_running_requests": "true"}, "reset_running_requests"),
])
def test_bad_parameters_are_named(server, params, param):
    response = httpx.post(server.url + "/reset_prefix_cache", params=params, timeout=30)
    assert response.status_code == 400
    assert param in response.json()["error"]["message"]
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
