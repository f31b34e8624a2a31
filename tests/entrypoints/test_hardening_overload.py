"""Overload: bounded queues answer the excess 503 + Retry-After at once, the admitted requests
all complete, and a request that waits too long fails with a clear error."""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import aiohttp
import httpx
import pytest

from tests.server_utils import (
    ENGINE_MODES,
    FAST_ENGINE_ARGS,
    SLOW_STEPS,
    ServerProcess,
    engine_mode_args,
    single_engine_only,
    stories_model,
)

NUM_CLIENTS = 1000
MAX_WAITING = 16
LONG = 400  # tokens per admitted request: long beside a rejection
@pytest.fixture(scope="module", params=ENGINE_MODES)
def server(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("overload")
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, *engine_mode_args(request.param),
                                             "--max-num-waiting-requests", str(MAX_WAITING)],
                           tmp / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="module", params=ENGINE_MODES)
def slow_server(request, tmp_path_factory):
    """Two sequences at a time, slow steps, a token bound on the queue and a 1 s timeout."""
    tmp = tmp_path_factory.mktemp("overload_slow")
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, *engine_mode_args(request.param),
                                             "--max-num-seqs", "2",
                                             "--max-num-waiting-tokens", "500",
                                             "--request-timeout", "1"],
                           tmp / "server.log", prelude=SLOW_STEPS)
    yield server
    server.stop()


def rejected(server, reason: str) -> float:
    return server.metrics()[f'vllm:num_requests_rejected_total{{reason="{reason}"}}']


def test_1000_concurrent_clients_against_a_small_queue(server):
    body = {"prompt": "Once upon a time", "max_tokens": LONG, "ignore_eos": True}

    async def one(http: aiohttp.ClientSession) -> tuple[int, float, dict, dict]:
        start = time.perf_counter()
        async with http.post("/v1/completions", json=body) as r:
            answer = json.loads(await r.read())
            return r.status, time.perf_counter() - start, dict(r.headers), answer

    async def scenario():
        # aiohttp: httpx's pool spends more time on 1,000 connections than the server does.
        connector = aiohttp.TCPConnector(limit=NUM_CLIENTS)
        async with aiohttp.ClientSession(server.url, connector=connector) as http:
            return await asyncio.gather(*(one(http) for _ in range(NUM_CLIENTS)))

    start = time.perf_counter()
    results = asyncio.run(scenario())
    elapsed = time.perf_counter() - start
    ok = [answer for status, _, _, answer in results if status == 200]
    busy = [(headers, answer) for status, _, headers, answer in results if status == 503]
    ok_times = [t for status, t, _, _ in results if status == 200]
    busy_times = sorted(t for status, t, _, _ in results if status == 503)
    print(f"overload: {len(ok)} admitted (median {statistics.median(ok_times):.2f} s), "
          f"{len(busy)} answered 503 (median {statistics.median(busy_times):.2f} s, "
          f"max {busy_times[-1]:.2f} s), {elapsed:.1f} s in all")
    assert len(ok) + len(busy) == NUM_CLIENTS
    assert len(ok) >= MAX_WAITING and len(busy) >= NUM_CLIENTS / 2
    assert all(answer["usage"]["completion_tokens"] == LONG for answer in ok)
    for headers, answer in busy:
        assert headers["Retry-After"] == "1"
        assert "max_num_waiting_requests" in answer["error"]["message"]
    # A rejection costs a parse and a queue check: it does not wait for generation (the
    # 1,000 clients' requests are read one by one, so rejections are not instant either).
    assert statistics.median(busy_times) < statistics.median(ok_times)
    assert rejected(server, "max_num_waiting_requests") == len(busy)
    assert httpx.get(server.url + "/health").status_code == 200
    r = httpx.post(server.url + "/v1/completions", timeout=30,
                   json={"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
    assert r.json()["choices"][0]["text"] == ", there was a little girl"


async def _open_blockers(http: httpx.AsyncClient, count: int) -> list:
    """Streams that occupy the whole batch (2 sequences) for seconds. Returns their line
    iterators, which the caller keeps: dropping one closes its connection."""
    body = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}
    blockers = [await http.send(http.build_request("POST", "/v1/completions", json=body),
                                stream=True) for _ in range(count)]
    lines = [blocker.aiter_lines() for blocker in blockers]
    for line in lines:  # both are running once each has sent a chunk
        assert (await anext(line)).startswith("data: ")
    return lines


@single_engine_only("the router sends the second request to the idle replica")
def test_token_bound_rejects_at_once(slow_server):
    long_prompt = [1] + [403] * 399  # 400 tokens: alone it may wait, two exceed 500

    async def scenario():
        async with httpx.AsyncClient(base_url=slow_server.url, timeout=60) as http:
            blockers = await _open_blockers(http, 2)
            first = asyncio.ensure_future(http.post("/v1/completions", json={
                "prompt": long_prompt, "max_tokens": 4}))
            while (await asyncio.to_thread(slow_server.metrics))[
                    "vllm:num_requests_waiting"] < 1:
                await asyncio.sleep(0.01)  # until it is queued
            start = time.perf_counter()
            second = await http.post("/v1/completions", json={"prompt": long_prompt,
                                                              "max_tokens": 4})
            waited = time.perf_counter() - start
            for blocker in blockers:
                await blocker.aclose()  # the client leaves: the blocker is aborted
            return second, waited, await first

    second, waited, first = asyncio.run(scenario())
    # At once: well under the seconds the blockers hold the batch (0.5 s on a quiet machine;
    # the bound leaves room for a busy one).
    assert second.status_code == 503 and waited < 1.5
    assert "max_num_waiting_tokens" in second.json()["error"]["message"]
    assert first.status_code in (200, 503)  # served, or timed out behind the blockers
    assert rejected(slow_server, "max_num_waiting_tokens") == 1


@single_engine_only("the router sends the request to the idle replica")
def test_request_timeout_fails_a_request_that_waited_too_long(slow_server):
    async def scenario():
        async with httpx.AsyncClient(base_url=slow_server.url, timeout=60) as http:
            blockers = await _open_blockers(http, 2)
            start = time.perf_counter()
            queued = await http.post("/v1/completions", json={"prompt": "One day",
                                                              "max_tokens": 4})
            waited = time.perf_counter() - start
            for blocker in blockers:
                await blocker.aclose()  # the client leaves: the blocker is aborted
            return queued, waited

    before = rejected(slow_server, "request_timeout")
    queued, waited = asyncio.run(scenario())
    assert queued.status_code == 503 and queued.headers["Retry-After"] == "1"
    message = queued.json()["error"]["message"]
    assert "timed out" in message and "request_timeout=1.0s" in message
    assert 1.0 <= waited < 4.0  # room for a busy machine
    assert rejected(slow_server, "request_timeout") == before + 1
