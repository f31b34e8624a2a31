"""vLLM's --runner on a real stories260K server: `--runner pooling` serves /v1/embeddings and
answers a completion, a chat completion and a response with a 400 naming --runner;
`--runner generate` answers /v1/embeddings so and still generates."""

from __future__ import annotations

import httpx
import pytest

from tests.server_utils import (
    CHAT_TEMPLATE,
    DATA_PARALLEL,
    FAST_ENGINE_ARGS,
    ServerProcess,
    stories_model,
)

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
GENERATION = [("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 2}),
              ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 2,
                                   "stream": True}),
              ("/v1/chat/completions", CHAT),
              ("/v1/responses", {"input": "Hi", "max_output_tokens": 2})]


def start(tmp_path_factory, name: str, *flags: str) -> ServerProcess:
    tmp = tmp_path_factory.mktemp(name)
    template = tmp / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    # The check is AsyncLLM's, whatever client it runs over: a thread where one engine core
    # serves, the default (process) under MINIVLLM_TEST_DATA_PARALLEL, which needs it.
    mode = ["--engine-mode", "thread"] if DATA_PARALLEL == 1 else []
    return ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, *mode,
                                           "--chat-template", str(template), *flags],
                         tmp / "server.log")


@pytest.fixture(scope="module")
def pooling_server(tmp_path_factory):
    server = start(tmp_path_factory, "runner_pooling", "--runner", "pooling", "--convert",
                   "embed")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def generate_server(tmp_path_factory):
    server = start(tmp_path_factory, "runner_generate", "--runner", "generate")
    yield server
    server.stop()


def post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def assert_refused(r: httpx.Response, runner: str, serves: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert f"--runner {runner}" in error["message"], error
    assert f"serves {serves} only" in error["message"], error
    assert error["param"] == "model" and error["type"] == "BadRequestError"


def test_a_pooling_runner_serves_embeddings_and_refuses_generation(pooling_server):
    r = post(pooling_server, "/v1/embeddings", {"input": ["Once upon a time", "Tom"]})
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == 2
    for path, body in GENERATION:
        assert_refused(post(pooling_server, path, body), "pooling", "embeddings")
    # Bad input never takes the engine down: it still serves.
    assert httpx.get(pooling_server.url + "/health").status_code == 200
    assert post(pooling_server, "/v1/embeddings", {"input": "Tom"}).status_code == 200


def test_a_generate_runner_refuses_embeddings(generate_server):
    assert_refused(post(generate_server, "/v1/embeddings", {"input": "Once upon a time"}),
                   "generate", "generation")
    r = post(generate_server, "/v1/completions", {"prompt": "Once upon a time",
                                                   "max_tokens": 2})
    assert r.status_code == 200, r.text
