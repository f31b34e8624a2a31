"""Async streaming client: replays a trace against any OpenAI-compatible server, timing each token.

Each request streams /v1/completions (or /v1/chat/completions) with ignore_eos, a fixed
max_tokens (or, without ignore_eos, max_tokens as a cap: the model's EOS ends it), usage in the
last chunk and the sampling fields given (bench/sampling.py: none by
default, so the server's default sampling applies, as in `vllm bench serve`). A chunk carrying text is one token
arrival (a final chunk with empty text and a finish_reason is only the end marker); the output
token count is the server's usage.completion_tokens when sent, else the number of arrivals.
A request succeeds when it has a first token, no error and the closing `data: [DONE]`; anything
else is a failure with its error text. Every entry of the trace yields exactly one result.
A minivllm server's usage chunk also says where the request's TTFT went (`timing`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp
from tqdm import tqdm

from minivllm.bench.workload import Trace


@dataclass
class RequestResult:
    index: int
    user: int
    priority: int | None
    prompt_tokens: int
    expected_output_tokens: int
    send_time: float  # scheduled by the trace, seconds after the replay started
    start: float = 0.0  # when it was really sent (later if --max-concurrency held it back)
    ttft: float | None = None  # seconds
    e2e: float | None = None  # seconds, sent -> last token
    itl: list[float] = field(default_factory=list)  # seconds between token arrivals
    output_tokens: int = 0
    success: bool = False
    error: str = ""
    # Seconds from sent to first scheduled, where the engine side says (sim; bench from the
    # server's --length-prediction-log); the output length the server's predictor predicted.
    queue_s: float | None = None
    predicted_output_tokens: float | None = None
    # Where the TTFT went, as the server saw it: a minivllm server's `timing` object
    # (entrypoints/openai/request_timing.py), None from other servers.
    server_timing: dict | None = None


async def server_info(session: aiohttp.ClientSession, base_url: str) -> tuple[str, int | None]:
    """(first served model id, its max_model_len if the server says) from GET /v1/models."""
    async with session.get(f"{base_url.rstrip('/')}/v1/models") as r:
        if r.status != 200:
            raise RuntimeError(f"GET /v1/models: HTTP {r.status}: {(await r.text())[:300]}")
        card = (await r.json())["data"][0]
    return card["id"], card.get("max_model_len")


def make_payload(model: str, prompt: list[int] | str, max_tokens: int, chat: bool,
                 priority: int | None, user: int, sampling: dict | None = None, *,
                 ignore_eos: bool = True, seed: int | None = None,
                 oracle_output_len: int | None = None,
                 stop_token_ids: list[int] | None = None) -> dict:
    """One request's body; `sampling` (temperature, top_p, ...) is sent as given; `seed`
    (sampling reproducible across runs) and `oracle_output_len` (the lab's field, for a
    server run with --length-predictor oracle) only when given."""
    body = {"model": model, "max_tokens": max_tokens, "ignore_eos": ignore_eos,
            "stream": True, "stream_options": {"include_usage": True}, "user": f"user-{user}",
            **(sampling or {})}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if priority is not None:
        body["priority"] = priority
    if seed is not None:
        body["seed"] = seed
    if oracle_output_len is not None:
        body["oracle_output_len"] = oracle_output_len
    if stop_token_ids:
        body["stop_token_ids"] = stop_token_ids
    return body


def _token_text(choice: dict, chat: bool) -> str | None:
    text = choice.get("delta", {}).get("content") if chat else choice.get("text")
    if text == "" and (choice.get("finish_reason") or choice.get("delta", {}).get("role")):
        return None  # an end marker or a role header, not a token
    return text


async def send_request(session: aiohttp.ClientSession, url: str, payload: dict, chat: bool,
                       result: RequestResult, t0: float) -> None:
    st = time.perf_counter()
    result.start = st - t0
    last, arrivals, usage_tokens, done, finished_at = st, 0, None, False, None
    try:
        async with session.post(url, json=payload) as r:
            if r.status != 200:
                result.error = f"HTTP {r.status}: {(await r.text())[:500]}"
                return
            async for raw in r.content:
                line = raw.decode("utf-8", errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                msg = json.loads(data)
                if "error" in msg:
                    result.error = f"stream error: {json.dumps(msg['error'])[:500]}"
                    return
                if msg.get("usage"):
                    usage_tokens = msg["usage"].get("completion_tokens")
                    result.server_timing = msg.get("timing")
                choices = msg.get("choices")
                if choices and choices[0].get("finish_reason"):
                    finished_at = time.perf_counter()
                if choices and _token_text(choices[0], chat) is not None:
                    now = time.perf_counter()
                    if result.ttft is None:
                        result.ttft = now - st
                    else:
                        result.itl.append(now - last)
                    last, arrivals = now, arrivals + 1
    except Exception as e:  # every failure is recorded on its request, never raised
        result.error = f"{type(e).__name__}: {e}"
        return
    result.output_tokens = usage_tokens if usage_tokens is not None else arrivals
    if result.ttft is None and done and usage_tokens and finished_at is not None:
        # Without ignore_eos the only token may be EOS, which has no text: the chunk that
        # finishes the request is its first token.
        result.ttft, last = finished_at - st, finished_at
    if result.ttft is None:
        result.error = "no token received"
    elif not done:
        result.error = "stream ended without [DONE]"
    else:
        result.e2e = last - st
        result.success = True


async def run_trace(trace: Trace, prompts: list, prompt_counts: list[int], base_url: str,
                    model: str, *,
                    endpoint: str = "completions", max_concurrency: int | None = None,
                    send_priority: bool = True, progress: bool = True,
                    sampling: dict | None = None, ignore_eos: bool = True,
                    request_seed: int | None = None,
                    oracle_lengths: list[int] | None = None,
                    stop_token_ids: list[int] | None = None,
                    ) -> tuple[list[RequestResult], float]:
    """Send every entry at its send_time (held back by max_concurrency); (results, seconds).
    `request_seed`: request i sends seed request_seed + i; `oracle_lengths`: request i sends
    oracle_output_len oracle_lengths[i]."""
    chat = endpoint == "chat"
    url = f"{base_url.rstrip('/')}/v1/{'chat/completions' if chat else 'completions'}"
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    bar = tqdm(total=len(trace.entries), disable=not progress, desc="requests")
    results = [RequestResult(i, e.user, e.priority, prompt_counts[i], e.output_tokens, e.send_time)
               for i, e in enumerate(trace.entries)]

    async def one(session: aiohttp.ClientSession, i: int, t0: float) -> None:
        entry, res = trace.entries[i], results[i]
        priority = entry.priority if send_priority else None
        payload = make_payload(
            model, prompts[i], entry.output_tokens, chat, priority, entry.user, sampling,
            ignore_eos=ignore_eos, seed=None if request_seed is None else request_seed + i,
            oracle_output_len=oracle_lengths[i] if oracle_lengths else None,
            stop_token_ids=stop_token_ids)
        if limit is None:
            await send_request(session, url, payload, chat, res, t0)
        else:
            async with limit:
                await send_request(session, url, payload, chat, res, t0)
        bar.update(1)

    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.perf_counter()
        tasks = []
        for i, entry in enumerate(trace.entries):
            delay = entry.send_time - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session, i, t0)))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
    bar.close()
    return results, duration
