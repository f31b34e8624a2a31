"""Fault injection: one failing request fails alone; a dead engine fails everything in
flight, turns /health to 503 and ends the process with a non-zero status — with the engine
core in its own process (the default) and on a thread of the server.

The faults are monkeypatches applied inside the server process and the engine-core process
(ServerProcess's prelude), keyed by the request's seed, so that no test hook lives in
minivllm itself.
"""

from __future__ import annotations

import asyncio
import json
import time

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

FAIL_ONE_SEED = 1001  # this request's 4th token raises (a detokenizer bug, say)
KILL_ENGINE_SEED = 1002  # a batch with this request raises in the forward pass
FAULTS = f"""
from minivllm.engine.output_processor import OutputProcessor
from minivllm.entrypoints.openai.serving import OpenAIServing
from minivllm.model.runner import ModelRunner

def _append_tokens(self, state, *args, _original=OutputProcessor._append_tokens):
    if state.params.seed == {FAIL_ONE_SEED} and len(state.output_token_ids) == 3:
        raise RuntimeError("injected fault: detokenizer exploded")
    return _original(self, state, *args)

def _execute(self, out, _original=ModelRunner.execute):
    params = [new.sampling_params for new in out.scheduled_new_reqs]
    params += [self.batch.requests[r].params for r in out.scheduled_cached_reqs.req_ids]
    if any(p.seed == {KILL_ENGINE_SEED} for p in params):
        raise RuntimeError("injected fault: the forward pass exploded")
    return _original(self, out)

def _encode(self, text, *args, _original=OpenAIServing.encode, **kwargs):
    if "TOKENIZER-FAULT" in text:
        raise RuntimeError("injected fault: tokenizer exploded")
    return _original(self, text, *args, **kwargs)

OutputProcessor._append_tokens = _append_tokens
ModelRunner.execute = _execute
OpenAIServing.encode = _encode
"""
GREEDY_8 = ", there was a little girl"


@pytest.fixture(scope="module", params=ENGINE_MODES)
def server(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, *engine_mode_args(request.param)],
                           tmp / "server.log", prelude=SLOW_STEPS + FAULTS)
    yield server
    server.stop()


def body(stream: bool = False, **fields) -> dict:
    return {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stream": stream,
            **fields}


async def post(http: httpx.AsyncClient, fields: dict) -> tuple[int, str]:
    r = await http.post("/v1/completions", json=fields)
    return r.status_code, r.text


def stream_events(text: str) -> list:
    return [line[6:] if line == "data: [DONE]" else json.loads(line[6:])
            for line in text.splitlines() if line.startswith("data: ")]


def test_one_failing_request_fails_alone(server):
    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            return await asyncio.gather(
                *(post(http, body(stream=i % 2 == 0)) for i in range(6)),
                post(http, body(seed=FAIL_ONE_SEED)),
                post(http, body(stream=True, seed=FAIL_ONE_SEED)),
                post(http, body(prompt="TOKENIZER-FAULT")))

    *normal, (status, text), (stream_status, stream_text), (tok_status, tok_text) = \
        asyncio.run(scenario())
    assert status == 500 and "injected fault: detokenizer exploded" in text
    events = stream_events(stream_text)
    assert stream_status == 200 and events[-1] == "[DONE]"
    assert events[0]["choices"][0]["text"]  # it failed mid-stream, after some text
    assert events[-2]["error"]["code"] == 500
    assert "detokenizer exploded" in events[-2]["error"]["message"]
    assert tok_status == 500 and "injected fault: tokenizer exploded" in tok_text
    for i, (code, text) in enumerate(normal):  # the others did not notice
        assert code == 200
        if i % 2:
            assert json.loads(text)["choices"][0]["text"] == GREEDY_8
        else:
            assert "".join(e["choices"][0]["text"] for e in stream_events(text)[:-1]) == GREEDY_8
    assert httpx.get(server.url + "/health").status_code == 200
    r = httpx.post(server.url + "/v1/completions", json=body(), timeout=30)
    assert r.json()["choices"][0]["text"] == GREEDY_8


@single_engine_only("Ray restarts a replica whose step failed")
def test_dead_engine_fails_everything_and_exits_non_zero(server):
    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            long = body(stream=True, max_tokens=400, ignore_eos=True)  # 2 s at least
            streams = [await http.send(http.build_request("POST", "/v1/completions", json=long),
                                       stream=True) for _ in range(3)]
            lines = [stream.aiter_lines() for stream in streams]
            firsts = [await anext(line) for line in lines]  # all three are running
            killed = await post(http, body(seed=KILL_ENGINE_SEED))
            health = None
            try:
                health = (await http.get("/health")).status_code
            except httpx.TransportError:  # already gone
                pass
            texts = []
            for first, stream_lines in zip(firsts, lines):
                texts.append("\n".join([first] + [line async for line in stream_lines]))
            return killed, health, texts

    start = time.monotonic()
    (status, text), health, streams = asyncio.run(scenario())
    assert status == 503 and "injected fault: the forward pass exploded" in text
    assert health in (503, None)
    for stream_text in streams:  # each stream ended, with the reason
        events = stream_events(stream_text)
        assert events[-1] == "[DONE]"
        assert events[-2]["error"]["code"] == 503
        assert "forward pass exploded" in events[-2]["error"]["message"]
    assert server.proc.wait(timeout=20) == 1
    assert time.monotonic() - start < 20
    log = server.log()
    assert "Traceback" in log and "the engine has died" in log
