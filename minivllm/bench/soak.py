"""The soak driver: thousands of mixed requests against one server, a fifth of whose clients
walk away, every answer that is read whole checked, and the server idle afterwards (every KV
block free). benchmarks/soak.py runs it long, tests/e2e/test_hardening_soak.py short.

Requests mix prompt lengths (shared prefixes among them), n from 1 to 4, random stop strings,
completions and chat, streamed or not. 20% of the clients disconnect: after a random delay
(their request queued, prefilling or running) or after a few streamed chunks.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

WORDS = ("once upon a time there was a little girl named Lily she loved to play outside in the "
         "park one day her mom said the dog was happy and they went home to eat cake").split()
STOPS = [".", ",", " the", "Lily", "!", " and", "\n", "park"]
PREFIXES = ["", "Once upon a time, ", "Tom and Sue went to the park. They saw a big dog. "]
DISCONNECT_SHARE = 0.2


@dataclass
class SoakRequest:
    path: str  # /v1/completions or /v1/chat/completions
    body: dict
    disconnect_after_s: float | None = None  # leave before the answer is read
    disconnect_after_chunks: int | None = None  # leave mid-stream


@dataclass
class SoakResult:
    statuses: Counter = field(default_factory=Counter)  # HTTP status, or "disconnected"
    failures: list[str] = field(default_factory=list)  # answers that broke a promise
    elapsed_s: float = 0.0

    def merge(self, other: SoakResult) -> None:
        self.statuses.update(other.statuses)
        self.failures += other.failures
        self.elapsed_s += other.elapsed_s


def make_requests(num: int, seed: int, model: str, max_tokens: int) -> list[SoakRequest]:
    rng = random.Random(seed)
    requests = []
    for _ in range(num):
        words = rng.choice([3, 10, 40, 120])  # mixed lengths, most of the range in tokens
        text = rng.choice(PREFIXES) + " ".join(rng.choices(WORDS, k=rng.randint(1, words)))
        stream = rng.random() < 0.5
        body = {"model": model, "max_tokens": rng.randint(1, max_tokens), "n": rng.randint(1, 4),
                "temperature": rng.choice([0.0, 0.8, 1.0]), "seed": rng.randrange(1000),
                "stream": stream}
        if rng.random() < 0.5:
            body["stop"] = rng.sample(STOPS, rng.randint(1, 3))
        if rng.random() < 0.3:
            path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": text}]
        else:
            path, body["prompt"] = "/v1/completions", text
        request = SoakRequest(path, body)
        if rng.random() < DISCONNECT_SHARE:
            body["max_tokens"] = 200  # more than it waits for: it leaves while work is left
            if stream and rng.random() < 0.5:
                request.disconnect_after_chunks = rng.randint(1, 3)
            else:
                request.disconnect_after_s = rng.uniform(0.0, 0.3)
        requests.append(request)
    return requests


def check_answer(request: SoakRequest, choices: dict[int, str | None], usage: dict) -> list[str]:
    """The promises a whole answer keeps: n choices indexed 0..n-1, each finished, usage."""
    n, problems = request.body["n"], []
    if sorted(choices) != list(range(n)):
        problems.append(f"choice indexes {sorted(choices)} for n={n}")
    if any(reason not in ("stop", "length") for reason in choices.values()):
        problems.append(f"finish reasons {choices}")
    if not 0 < usage.get("completion_tokens", 0) <= n * request.body["max_tokens"]:
        problems.append(f"usage {usage}")
    return problems


async def _read_stream(response: httpx.Response, request: SoakRequest) -> list[str] | None:
    """Check a stream; None when the client left before its end (on purpose)."""
    choices: dict[int, str | None] = {}
    usage: dict = {}
    chunks = 0
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            return check_answer(request, choices, usage)
        event = json.loads(line[6:])
        if "error" in event:
            return [f"error event {event['error']}"]
        for choice in event["choices"]:
            choices[choice["index"]] = choice["finish_reason"] or choices.get(choice["index"])
        usage = event.get("usage") or usage
        chunks += 1
        if chunks == request.disconnect_after_chunks:
            return None
    return ["stream ended without [DONE]"]


async def _send(http: httpx.AsyncClient, request: SoakRequest, result: SoakResult) -> None:
    body = request.body
    if body["stream"]:
        body = {**body, "stream_options": {"include_usage": True}}
    async with http.stream("POST", request.path, json=body) as response:
        if response.status_code != 200:
            result.statuses[response.status_code] += 1
            result.failures.append(f"{response.status_code}: {(await response.aread())[:300]}")
            return
        if body["stream"]:
            problems = await _read_stream(response, request)
        else:
            answer = json.loads(await response.aread())
            choices = {c["index"]: c["finish_reason"] for c in answer["choices"]}
            problems = check_answer(request, choices, answer["usage"])
    if problems is None:
        result.statuses["disconnected"] += 1
        return
    result.statuses[200] += 1
    result.failures += [f"{request.path} {request.body}: {p}" for p in problems]


async def _one(http: httpx.AsyncClient, request: SoakRequest, result: SoakResult) -> None:
    try:
        if request.disconnect_after_s is None:
            await _send(http, request, result)
        else:
            await asyncio.wait_for(_send(http, request, result), request.disconnect_after_s)
    except asyncio.TimeoutError:  # wait_for gave up: the client left
        result.statuses["disconnected"] += 1


async def run_soak(url: str, requests: list[SoakRequest], concurrency: int) -> SoakResult:
    result = SoakResult()
    queue: asyncio.Queue[SoakRequest] = asyncio.Queue()
    for request in requests:
        queue.put_nowait(request)

    async def client() -> None:
        while not queue.empty():
            await _one(http, queue.get_nowait(), result)

    start = time.perf_counter()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        await asyncio.gather(*(client() for _ in range(concurrency)))
    result.elapsed_s = time.perf_counter() - start
    return result


def metric(url: str, name: str) -> float:
    """A metric's value summed over its label sets."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def wait_idle(url: str, timeout: float = 60.0) -> None:
    """Until no request is left and every KV block is free, in the device and swap pools."""
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting",
             "vllm:num_requests_swapped", "vllm:kv_cache_usage_perc", "vllm:cpu_cache_usage_perc")
    deadline = time.monotonic() + timeout
    while any(metric(url, name) for name in names):
        if time.monotonic() > deadline:
            raise AssertionError({name: metric(url, name) for name in names})
        time.sleep(0.1)


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20
