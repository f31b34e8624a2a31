"""SIGTERM: the server stops admitting (503), lets requests in flight finish within
--shutdown-timeout, aborts the rest with an error their clients see, and exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import pytest

from tests.server_utils import (
    ENGINE_MODES,
    FAST_ENGINE_ARGS,
    SLOW_STEPS,
    ServerProcess,
    engine_mode_args,
    stories_model,
)

SHUTDOWN_TIMEOUT = 1.5


@pytest.mark.parametrize("mode", ENGINE_MODES)
def test_sigterm_drains_then_exits_zero(tmp_path, mode):
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, *engine_mode_args(mode),
                                             "--shutdown-timeout", str(SHUTDOWN_TIMEOUT)],
                           tmp_path / "server.log", prelude=SLOW_STEPS)
    try:
        async def scenario():
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
                # Long: at least 500 steps of 5 ms, more than the shutdown timeout.
                long = await http.send(http.build_request("POST", "/v1/completions", json={
                    "prompt": "Once upon a time", "max_tokens": 500, "ignore_eos": True,
                    "stream": True}), stream=True)
                lines = long.aiter_lines()
                first_line = await anext(lines)
                short = asyncio.ensure_future(http.post("/v1/completions", json={
                    "prompt": "One day", "max_tokens": 20, "ignore_eos": True}))
                while not short.done() and (await asyncio.to_thread(server.metrics))[
                        "vllm:num_requests_running"] < 2:
                    await asyncio.sleep(0.01)  # until both are in the engine
                signalled = time.monotonic()
                server.proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.3)
                refused = await http.post("/v1/completions", json={"prompt": "Hi"})
                health = await http.get("/health")
                rejected = server.metrics()['vllm:num_requests_rejected_total{reason="shutdown"}']
                rest = [line async for line in lines]
                return (first_line, rest, await short, refused, health, rejected,
                        time.monotonic() - signalled)

        first_line, rest, short, refused, health, rejected, long_ended = asyncio.run(scenario())
        assert short.status_code == 200 and short.json()["usage"]["completion_tokens"] == 20
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert "shutting down" in refused.json()["error"]["message"]
        assert health.status_code == 503 and rejected == 1
        # The long stream was cut at the timeout, with an error event, and ended properly.
        events = [line for line in [first_line, *rest] if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2][6:])["error"]
        assert error["code"] == 503 and "shut down before the request finished" in error["message"]
        assert SHUTDOWN_TIMEOUT <= long_ended < SHUTDOWN_TIMEOUT + 3  # room for a busy machine
        assert server.proc.wait(timeout=10) == 0
        assert "aborted 1 request(s) still in flight" in server.log()
    finally:
        server.stop()


@pytest.mark.parametrize("mode", ENGINE_MODES)
def test_idle_sigterm_exits_zero_at_once(tmp_path, mode):
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, *engine_mode_args(mode)],
                           tmp_path / "server.log")
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=15) == 0
    # Idle: nothing to wait for, so far below the 20 s --shutdown-timeout (the bound leaves
    # room for a busy shared machine).
    assert time.monotonic() - start < 8
    assert "every request in flight finished" in server.log()
    server.stop()
