"""The engine core in a process of its own (`minivllm serve --engine-mode process`, the
default) and on a thread (--engine-mode thread): the messages between the two processes,
the server end to end in both modes, aborts that free the core's blocks, and the core's
death — killed mid-request, it fails what is in flight and the server exits non-zero."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from types import SimpleNamespace

import httpx
import msgspec
import openai
import psutil
import pytest

from minivllm.config import EngineConfig
from minivllm.core.scheduler_stats import SchedulerStats
from minivllm.engine.errors import EngineDeadError
from minivllm.engine.messages import (
    EngineCoreAbort,
    EngineCoreDead,
    EngineCoreInput,
    EngineCoreMessage,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreShutdown,
    EngineCoreUtility,
    UtilityResult,
    make_core_request,
    pack_logprobs,
    unpack_logprobs,
)
from minivllm.outputs import Logprob
from minivllm.sampling_params import RequestOutputKind, SamplingParams
from tests.server_utils import (
    DATA_PARALLEL,
    ENGINE_MODES,
    FAST_ENGINE_ARGS,
    SLOW_STEPS,
    ServerProcess,
    engine_mode_args,
    single_engine_only,
    stories_model,
)

PROMPT = "Once upon a time"
GREEDY_32 = (", there was a little girl named Lily. She loved to play outside in the park. "
             "One day, she saw")
LONG = {"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "ignore_eos": True}


def roundtrip(msg, kind):
    return msgspec.msgpack.Decoder(kind).decode(msgspec.msgpack.encode(msg))


def test_messages_round_trip():
    params = SamplingParams(n=2, best_of=3, temperature=0.7, stop="Lily", stop_token_ids=[5],
                            seed=11, max_tokens=20, output_kind=RequestOutputKind.DELTA)
    request = make_core_request("r1", [1, 2, 3], params, priority=-1, cache_salt="s")
    assert request.sampling_params.logprobs == 0  # best_of ranks by logprob...
    assert params.logprobs is None  # ... the caller's params are left alone
    for msg in (request, EngineCoreAbort(["r1", "r2#1"], stopped=True),
                EngineCoreUtility(7, "get_stats"),
                EngineCoreUtility(8, "reset_prefix_cache", {"reset_external": True}),
                EngineCoreShutdown()):
        assert roundtrip(msg, EngineCoreInput) == msg
    decoded = roundtrip(request, EngineCoreInput).sampling_params
    assert decoded == request.sampling_params
    assert decoded.output_kind is RequestOutputKind.DELTA and decoded.stop == ["Lily"]

    entry = {9: Logprob(-0.5, 2), 4: Logprob(-0.1, 1)}
    assert unpack_logprobs(pack_logprobs(entry)) == entry
    step = EngineCoreOutputs(
        timestamp=1.5, num_prompt_tokens=3,
        scheduler_stats=SchedulerStats(num_running=1, num_total_blocks=8, num_free_blocks=6,
                                       kv_cache_usage=0.25),
        outputs=[EngineCoreOutput("r1", 1, [9], [pack_logprobs(entry)],
                                  prompt_logprobs=(1, [pack_logprobs({2: Logprob(-3.0, 7)})]),
                                  finish_reason="stop", stop_reason=5, num_cached_tokens=16,
                                  first_scheduled_time=1.25),
                 EngineCoreOutput("r2", error="queue full", error_kind="overloaded",
                                  overload_reason="max_num_waiting_requests")])
    for msg in (step, EngineCoreReady(max_model_len=512),
                UtilityResult(7, result=SchedulerStats(num_waiting=2)),
                UtilityResult(8, error="unknown"), UtilityResult(9, result=True),
                EngineCoreDead("boom")):
        assert roundtrip(msg, EngineCoreMessage) == msg


@pytest.fixture(scope="module", params=ENGINE_MODES)
def server(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"engine_{request.param}")
    args = [*FAST_ENGINE_ARGS, *engine_mode_args(request.param), "--engine-threads", "1"]
    server = ServerProcess(stories_model(), args, tmp / "server.log", prelude=SLOW_STEPS)
    server.mode = request.param
    yield server
    server.stop()


def core_pid(server) -> int:
    return int(re.search(r"engine core process started \(pid (\d+)\)", server.log()).group(1))


def test_openai_client_end_to_end(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    model = str(stories_model())
    resp = client.completions.create(model=model, prompt=PROMPT, max_tokens=32, temperature=0)
    assert resp.choices[0].text == GREEDY_32
    assert resp.usage.completion_tokens == 32
    stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=32,
                                       temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in stream) == GREEDY_32
    # A stop string ends the sequence in the API server; the core is told to stop it.
    resp = client.completions.create(model=model, prompt=PROMPT, max_tokens=32, temperature=0,
                                     stop=["Lily"], n=2)
    for choice in resp.choices:
        assert choice.text == GREEDY_32[:GREEDY_32.index("Lily")]
        assert choice.finish_reason == "stop" and choice.stop_reason == "Lily"
    # Input only the core can judge (more sequences than a batch holds) is this request's
    # 400, not the core's end.
    with pytest.raises(openai.BadRequestError, match="max_num_seqs"):
        client.completions.create(model=model, prompt=PROMPT, max_tokens=4, n=9)
    assert client.completions.create(model=model, prompt=PROMPT, max_tokens=4,
                                     temperature=0).choices[0].text == ", there was a"
    if server.mode == "process" and DATA_PARALLEL == 1:  # the core: a child, one thread
        assert core_pid(server) in [p.pid for p in psutil.Process(server.proc.pid).children()]
        assert "(1 torch threads)" in server.log()


def test_abort_on_disconnect_frees_the_cores_blocks(server):
    before = server.metrics()
    abort_key = 'vllm:request_success_total{finished_reason="abort"}'

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            request = http.build_request("POST", "/v1/completions", json={**LONG, "stream": True})
            response = await http.send(request, stream=True)
            lines = response.aiter_lines()
            assert (await anext(lines)).startswith("data: ")  # it is running
            running = server.metrics()
            await response.aclose()  # the client leaves mid-stream
            return running

    running = asyncio.run(scenario())
    assert running["vllm:kv_cache_usage_perc"] > 0
    deadline = time.monotonic() + 10  # 400 tokens take at least 2 s (SLOW_STEPS)
    while time.monotonic() < deadline:
        after = server.metrics()
        # the abort's count and the blocks' release reach the metrics in separate messages
        # (with data parallel, from the frontend and from the replica's next stats)
        if (after[abort_key] == before[abort_key] + 1
                and after["vllm:kv_cache_usage_perc"] == 0):
            break
        time.sleep(0.05)
    assert after[abort_key] == before[abort_key] + 1
    assert after["vllm:kv_cache_usage_perc"] == 0 and after["vllm:num_requests_running"] == 0
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 400


@single_engine_only("a replica that dies is restarted by Ray (test_ray_data_parallel.py)")
def test_killed_engine_core_fails_requests_and_the_server_exits(tmp_path):
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, *engine_mode_args("process")],
                           tmp_path / "server.log", prelude=SLOW_STEPS)
    try:
        async def scenario():
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
                request = http.build_request("POST", "/v1/completions",
                                             json={**LONG, "stream": True})
                streams = [await http.send(request, stream=True) for _ in range(2)]
                lines = [stream.aiter_lines() for stream in streams]
                firsts = [await anext(line) for line in lines]  # both are running
                os.kill(core_pid(server), signal.SIGKILL)
                texts = []
                for first, stream_lines in zip(firsts, lines):
                    texts.append("\n".join([first] + [line async for line in stream_lines]))
                health = None
                try:  # the server noticed: 503 until it has exited
                    health = (await http.get("/health")).status_code
                except httpx.TransportError:  # already gone
                    pass
                return health, texts

        start = time.monotonic()
        health, texts = asyncio.run(scenario())
        assert health in (503, None)
        for text in texts:  # each stream ended, with the reason
            events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            error = json.loads(events[-2])["error"]
            assert error["code"] == 503 and "engine core process died" in error["message"]
        assert server.proc.wait(timeout=20) == 1
        assert time.monotonic() - start < 20
        assert "the engine has died" in server.log()
    finally:
        server.stop()


def test_async_llm_stats_call_and_death(tmp_path):
    """The frontend client itself: a disconnect frees the core's blocks (asked of the core
    with a utility call); a killed core fails the request in flight and turns /health 503."""
    from minivllm.engine.async_llm import AsyncLLM
    from minivllm.entrypoints.openai.api_server import build_app

    config = EngineConfig(model=str(stories_model()), num_kv_blocks=64, swap_space=0.05)
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)

    async def scenario():
        engine = AsyncLLM.from_config(config, log_interval=60)
        try:
            gen = engine.generate(PROMPT, params, "a")
            first = await anext(gen)
            assert first.outputs[0].token_ids
            busy = await engine.get_stats()
            assert busy.num_running == 1 and busy.num_free_blocks < busy.num_total_blocks
            await gen.aclose()  # the consumer leaves: an abort
            idle = await engine.get_stats()
            assert idle.num_running == 0 and idle.num_free_blocks == idle.num_total_blocks

            app = build_app(engine, SimpleNamespace())
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://test") as http:
                assert (await http.get("/health")).status_code == 200
                gen = engine.generate(PROMPT, params, "b")
                await anext(gen)
                os.kill(engine._client.proc.pid, signal.SIGKILL)
                with pytest.raises(EngineDeadError, match="died unexpectedly"):
                    while True:
                        await asyncio.wait_for(anext(gen), timeout=10)
                assert engine.crashed and not engine.is_running
                assert (await http.get("/health")).status_code == 503
            with pytest.raises(EngineDeadError):
                await anext(engine.generate(PROMPT, params, "c"))
        finally:
            engine.shutdown()

    asyncio.run(scenario())


def test_core_that_fails_to_start_ends_the_server(tmp_path):
    # The model's limit is 512: the core refuses while it loads; a bad setting is a usage
    # error (exit 2, the message, no traceback).
    with pytest.raises(RuntimeError, match=r"server exited with 2(.|\n)*error: max_model_len "
                                           r"\(4096\) exceeds the model's limit \(512\)"):
        ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, "--max-model-len", "4096"],
                      tmp_path / "server.log")
