"""Many clients at once: one continuous batch, client disconnects, the stats log line."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import openai
import pytest

from minivllm import LLM, SamplingParams
from tests.server_utils import (
    ENGINE_MODES,
    FAST_ENGINE_ARGS,
    ServerProcess,
    engine_mode_args,
    single_engine_only,
    stories_model,
)

LOG_INTERVAL = 1.0
MAX_NUM_SEQS = 8  # FAST_ENGINE_ARGS
NAMES = ["Lily", "Tom", "Sue", "Ben", "Max", "Anna", "Tim", "Sam"]
PROMPTS = [f"{start} {name}" for start in ("Once upon a time", "One day", "The dog saw",
                                           "She was happy and")
           for name in NAMES]  # 32 different prompts
LINE = re.compile(
    r"Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, "
    r"Running: (\d+) reqs, Swapped: (\d+) reqs, Waiting: (\d+) reqs, "
    r"KV cache usage: ([\d.]+)%, Prefix cache hit rate: ([\d.]+)%")


@pytest.fixture(scope="module", params=ENGINE_MODES)
def server(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server_load")
    # Room for a full batch of long requests, so that nothing is preempted.
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, *engine_mode_args(request.param),
                                             "--num-kv-blocks", "300",
                                             "--log-interval", str(LOG_INTERVAL)],
                           tmp / "server.log")
    yield server
    server.stop()


def wait_for(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def idle(server) -> bool:
    m = server.metrics()
    return (m["vllm:num_requests_running"] == m["vllm:num_requests_waiting"] == 0
            and m["vllm:kv_cache_usage_perc"] == 0)


async def stream_completion(client, prompt: str, max_tokens: int) -> str:
    stream = await client.completions.create(model=str(stories_model()), prompt=prompt,
                                             max_tokens=max_tokens, temperature=0, stream=True)
    return "".join([chunk.choices[0].text async for chunk in stream])


def test_32_concurrent_streams_match_offline(server):
    async def run_all():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        async with client:
            return await asyncio.gather(*(stream_completion(client, p, 24) for p in PROMPTS))

    texts = asyncio.run(run_all())
    offline = LLM(model=str(stories_model()), num_kv_blocks=128, swap_space=0.05)
    expected = offline.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24),
                                use_tqdm=False)
    assert texts == [out.outputs[0].text for out in expected]
    wait_for(lambda: idle(server), what="the server to go idle")


def test_disconnects_free_blocks_and_count_aborts(server):
    wait_for(lambda: idle(server), what="the server to go idle")
    before = server.metrics()
    abort_key = 'vllm:request_success_total{finished_reason="abort"}'

    length_key = 'vllm:request_success_total{finished_reason="length"}'

    def aborts() -> float:
        return server.metrics()[abort_key] - before[abort_key]

    def arrived() -> float:  # requests the engine has seen, done or not
        m = server.metrics()
        return (m["vllm:num_requests_running"] + m["vllm:num_requests_waiting"]
                + m[length_key] - before[length_key])

    # A batch runs 500 tokens in about a second here: a deep queue keeps the server busy
    # for several, so that the disconnects below find their requests queued or running.
    body = {"prompt": "Once upon a time", "max_tokens": 500, "temperature": 0,
            "ignore_eos": True}
    num_blockers = 5 * MAX_NUM_SEQS

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            async def open_stream():
                request = http.build_request("POST", "/v1/completions",
                                             json={**body, "stream": True})
                return await http.send(request, stream=True)

            blockers = [asyncio.ensure_future(open_stream()) for _ in range(num_blockers)]
            await asyncio.to_thread(wait_for, lambda: arrived() == num_blockers, 60, "a queue")
            # The last in line: its client gives up while it waits.
            queued = asyncio.ensure_future(http.post("/v1/completions", json=body))
            await asyncio.to_thread(wait_for, lambda: arrived() == num_blockers + 1, 60,
                                    "it to queue")
            queued.cancel()
            await asyncio.to_thread(wait_for, lambda: aborts() == 1, 30, "the queued abort")
            assert server.metrics()["vllm:num_requests_waiting"] > 0  # it was aborted queued
            # A client that leaves mid-stream.
            running = next(t for t in blockers if t.done()).result()
            lines = running.aiter_lines()
            assert (await anext(lines)).startswith("data: ")
            await running.aclose()
            await asyncio.to_thread(wait_for, lambda: aborts() == 2, 30, "the mid-stream abort")
            for task in blockers:  # everybody else leaves too
                task.cancel()
                if task.done() and not task.cancelled():
                    await task.result().aclose()
            await asyncio.gather(*blockers, queued, return_exceptions=True)

    asyncio.run(scenario())
    wait_for(lambda: idle(server), what="every KV block to be freed")
    after = server.metrics()
    assert after["vllm:kv_cache_usage_perc"] == 0
    finished = {reason: after[f'vllm:request_success_total{{finished_reason="{reason}"}}']
                - before[f'vllm:request_success_total{{finished_reason="{reason}"}}']
                for reason in ("abort", "length", "stop")}
    assert finished["abort"] >= 2 and finished["stop"] == 0
    assert finished["abort"] + finished["length"] == num_blockers + 1
    # The server goes on serving.
    r = httpx.post(server.url + "/v1/completions", json={**body, "max_tokens": 4}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def stats_lines(log: str) -> list[tuple[float, ...]]:
    return [tuple(float(x) for x in m.groups()) for m in LINE.finditer(log)]


@single_engine_only("replicas log a line each and a total")
def test_stats_log_line_under_load(server):
    wait_for(lambda: idle(server), what="the server to go idle")
    time.sleep(2 * LOG_INTERVAL)  # let the idle line of earlier traffic pass
    before = server.metrics()
    skip = len(stats_lines(server.log()))
    # Five waves of a full batch: a wave of 300 tokens can take under a second here, and a
    # log line samples Running only once a second, so one wave alone may fall between lines.
    prompts = PROMPTS + PROMPTS[:8]

    async def run_all():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            bodies = [{"prompt": p, "max_tokens": 300, "temperature": 0, "ignore_eos": True}
                      for p in prompts]
            return await asyncio.gather(*(http.post("/v1/completions", json=b) for b in bodies))

    responses = asyncio.run(run_all())
    assert all(r.status_code == 200 for r in responses)
    wait_for(lambda: idle(server), what="the server to go idle")
    time.sleep(3 * LOG_INTERVAL)  # the last busy interval, one idle line, then silence
    after = server.metrics()
    lines = stats_lines(server.log())[skip:]
    assert len(lines) >= 2, server.log()[-3000:]

    busy = [line for line in lines if line[1] > 0]
    assert max(line[2] for line in busy) == MAX_NUM_SEQS  # Running: a full batch
    assert max(line[4] for line in busy) >= 1  # Waiting: the rest
    assert all(line[2] + line[4] <= len(prompts) and line[3] == 0 for line in lines)
    assert any(line[5] > 0 for line in busy) and all(0 <= line[5] <= 100 for line in lines)
    # Throughput times the interval adds up to the tokens the engine counted.
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    prompt = after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"]
    assert generated == len(prompts) * 300
    assert sum(line[1] for line in lines) * LOG_INTERVAL == pytest.approx(generated, rel=0.1)
    assert sum(line[0] for line in lines) * LOG_INTERVAL == pytest.approx(prompt, rel=0.1)
    # Quiet when idle: one all-zero line after the load, then nothing.
    assert lines[-1][:5] == (0, 0, 0, 0, 0) and lines[-2][1] > 0
    assert json.loads(httpx.get(server.url + "/version").text)["version"]
